"""A body over its route's limit is read to its end before the 413 (else Envoy resets the
connection the client is still writing to)."""

from __future__ import annotations

import json
from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from filters.oversize import drain_body, oversize_limit, oversize_reply
from policy.phases import OVERSIZE_ROUTE_PREFIX

EOF_ = object()


class FakeStream:
    def __init__(self, messages: list[pb.ProcessingRequest]) -> None:
        self.inbox = list(messages)
        self.read_count = 0

    async def read(self) -> Any:
        self.read_count += 1
        return self.inbox.pop(0) if self.inbox else EOF_


def body(n: int, end: bool = False) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=b"x" * n, end_of_stream=end))


async def test_the_body_is_read_to_its_last_chunk() -> None:
    s = FakeStream([pb.ProcessingRequest(request_headers=pb.HttpHeaders()), body(1000),
                    body(1000), body(24, end=True)])  # fmt: skip
    assert await drain_body(s.read, EOF_) == 2024
    assert not s.inbox
    reply = oversize_reply(512)
    assert reply.immediate_response.status.code == 413
    err = json.loads(reply.immediate_response.body)["error"]
    assert err["code"] == 413 and "512 bytes" in err["message"]


async def test_past_the_drain_cap_it_stops_reading_and_a_gone_client_gets_nothing() -> None:
    s = FakeStream([body(600), body(600), body(600, end=True)])
    assert await drain_body(s.read, EOF_, max_bytes=1000) == 1200
    assert s.inbox  # the rest was never read
    gone = FakeStream([body(100)])
    assert await drain_body(gone.read, EOF_) is None


def test_route_names() -> None:
    assert oversize_limit(f"{OVERSIZE_ROUTE_PREFIX}65536", OVERSIZE_ROUTE_PREFIX) == 65536
    assert oversize_limit("llm", OVERSIZE_ROUTE_PREFIX) is None
