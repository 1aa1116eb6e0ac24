"""A body over its route's limit is read to its end before the 413 (else Envoy resets the
connection the client is still writing to)."""

from __future__ import annotations

import json
from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from controlplane.policy.phases import OVERSIZE_ROUTE_PREFIX
from filters.oversize import answer_oversized, oversize_limit

EOF_ = object()


class FakeStream:
    def __init__(self, messages: list[pb.ProcessingRequest]) -> None:
        self.inbox = list(messages)
        self.read_count = 0
        self.sent: list[pb.ProcessingResponse] = []

    async def read(self) -> Any:
        self.read_count += 1
        return self.inbox.pop(0) if self.inbox else EOF_

    async def write(self, msg: pb.ProcessingResponse) -> None:
        assert not self.inbox, "answered before the body had arrived"
        self.sent.append(msg)


def body(n: int, end: bool = False) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=b"x" * n, end_of_stream=end))


async def test_the_413_comes_after_the_last_body_chunk() -> None:
    s = FakeStream([pb.ProcessingRequest(request_headers=pb.HttpHeaders()), body(1000),
                    body(1000), body(24, end=True)])  # fmt: skip
    assert await answer_oversized(s.read, s.write, EOF_, 512) == 2024
    (reply,) = s.sent
    assert reply.immediate_response.status.code == 413
    err = json.loads(reply.immediate_response.body)["error"]
    assert err["code"] == 413 and "512 bytes" in err["message"]


async def test_past_the_drain_cap_it_answers_at_once_and_a_gone_client_gets_nothing() -> None:
    s = FakeStream([body(600), body(600), body(600, end=True)])

    async def write(msg: pb.ProcessingResponse) -> None:
        s.sent.append(msg)

    assert await answer_oversized(s.read, write, EOF_, 10, max_bytes=1000) == 1200
    assert len(s.sent) == 1 and s.inbox  # the rest was never read
    gone = FakeStream([body(100)])
    assert await answer_oversized(gone.read, gone.write, EOF_, 10) == 100
    assert gone.sent == []


def test_route_names() -> None:
    assert oversize_limit(f"{OVERSIZE_ROUTE_PREFIX}65536", OVERSIZE_ROUTE_PREFIX) == 65536
    assert oversize_limit("llm", OVERSIZE_ROUTE_PREFIX) is None
