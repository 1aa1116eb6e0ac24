"""Two filter servers (``python -m filters``, real processes) sharing one pool and a real Redis,
driven over ext_proc gRPC as Envoy drives them: a client one server sheds with a Retry-After,
back when told at the *other* server, goes first there (past a full queue, before that
server's own waiter); its promise is kept once."""

from __future__ import annotations

import asyncio
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from tests.helpers import ChildProcess, free_port, wait_for_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

BODY_LENGTH = "321"  # the return key: tenant, content-length, Idempotency-Key


def _policy() -> str:
    tenants = ", ".join(f"{t}: {{tier: pro, api_keys: [{t}-key-1234]}}" for t in "hwxz")
    return f"""
version: 1
filters: {{message_timeout: 10s}}
pools: {{chat: {{models: [m1], endpoints: [127.0.0.1:9], capacity: {{max_running_requests: 2}}}}}}
gateways: {{edge: {{routes: [{{name: llm, pool: chat, filters: {{plugins: [identity, admission]}}}}]}}}}
admission: {{interactive: {{ttft_budget: 10s, max_wait: 3s, max_queue: 1, max_queue_per_tenant: 1}}}}
tiers: {{pro: {{}}}}
tenants: {{{tenants}}}
"""


class Stream:
    """One request's ext_proc stream: its request headers sent, the server's first answer."""

    def __init__(self, channel: grpc.aio.Channel, tenant: str) -> None:
        headers = [
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            ("authorization", f"Bearer {tenant}-key-1234"),
            ("content-length", BODY_LENGTH),
        ]
        hm = base_pb2.HeaderMap(
            headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers]
        )
        self.call = pb_grpc.ExternalProcessorStub(channel).Process(
            metadata=(("x-tokenweir-route", "llm"),)
        )
        self.first = pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=hm))
        self.answer: asyncio.Task[pb.ProcessingResponse] | None = None

    async def send(self) -> Stream:
        await self.call.write(self.first)
        self.answer = asyncio.create_task(self._answer())
        await asyncio.sleep(0.2)  # the server's turn
        return self

    async def _answer(self) -> pb.ProcessingResponse:
        """The first message that is not a hold (``override_message_timeout``: queued)."""
        while True:
            r = await self.call.read()
            assert isinstance(r, pb.ProcessingResponse), r
            if not r.HasField("override_message_timeout"):
                return r

    def admitted(self) -> bool:
        a = self.answer
        return a is not None and a.done() and not a.result().HasField("immediate_response")

    def waiting(self) -> bool:
        return self.answer is not None and not self.answer.done()

    def shed(self) -> dict[str, str]:
        """The 503's headers (the stream must have been answered with one)."""
        assert self.answer is not None and self.answer.done()
        r = self.answer.result().immediate_response
        assert r.status.code == 503, r
        return {h.header.key: h.header.raw_value.decode() for h in r.headers.set_headers}

    def close(self) -> None:
        self.call.cancel()


def _metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def test_a_client_shed_by_one_filter_server_goes_first_at_the_other(
    tmp_path: Path, redis_port: int
) -> None:
    path = tmp_path / "mesh.yaml"
    path.write_text(_policy())
    ports = [(free_port(), free_port()) for _ in range(2)]
    servers = []
    for i, (fp, mp) in enumerate(ports):
        argv = [sys.executable, "-m", "filters", "--policy", str(path), "--instances", "2"]
        argv += ["--listen", f"127.0.0.1:{fp}", "--metrics-port", str(mp)]
        argv += ["--redis-url", f"redis://127.0.0.1:{redis_port}/0"]
        servers.append(ChildProcess(argv, log=tmp_path / f"filters-{i}.log"))
    streams: list[Stream] = []
    try:
        for fp, _ in ports:
            await asyncio.to_thread(wait_for_port, fp, 20.0)
        a, b = (grpc.aio.insecure_channel(f"127.0.0.1:{fp}") for fp, _ in ports)
        (_, ma), (_, mb) = ports

        async def stream(ch: grpc.aio.Channel, tenant: str) -> Stream:
            s = await Stream(ch, tenant).send()
            streams.append(s)
            return s

        # each server admits one (half the pool) and queues one: both full
        held_a, wait_a = await stream(a, "h"), await stream(a, "w")
        held_b = await stream(b, "h")
        assert held_a.admitted() and held_b.admitted() and wait_a.waiting()
        # x is shed by a (its queue is full) and told when to come back
        told = (await stream(a, "x")).shed()
        assert told["retry-after"] and _metric(ma, "tokenweir_admission_shared_returns_total{")
        back_at = time.monotonic() + int(told["retry-after-ms"]) / 1000
        await asyncio.sleep(max(0.0, back_at - 0.6 - time.monotonic()))
        wait_b = await stream(b, "w")  # b's queue full too: a fresh client is turned away there
        assert wait_b.waiting()
        assert "retry-after" in (await stream(b, "z")).shed()
        await asyncio.sleep(max(0.0, back_at - time.monotonic()))
        back = await stream(b, "x")
        assert back.waiting(), "x came back when told: b must queue it past its full queue"
        assert _metric(mb, 'tokenweir_admission_shared_returns_total{outcome="taken"}') == 1
        held_b.close()  # b's slot frees: x goes before b's own waiter
        await asyncio.sleep(0.5)
        assert back.admitted() and wait_b.waiting()
        # a, which made the promise, heard that b kept it (a marker, polled every 250 ms)
        assert (
            _metric(ma, 'tokenweir_admission_shared_returns_total{outcome="kept_elsewhere"}') == 1
        )
        claimed = (
            'tokenweir_admission_returns_total{lane="interactive",outcome="claimed",pool="chat"}'
        )
        assert _metric(ma, claimed) == 1  # counted there as a client that came back
        # kept once: the same request again, at b, is a fresh one: no promise is taken for it
        # (it is turned away if b's queue is still full, or queued behind; b's own waiter may
        # have been shed by then, as it could not start before z, told at b, is due back)
        again = await stream(b, "x")
        assert _metric(mb, 'tokenweir_admission_shared_returns_total{outcome="taken"}') == 1
        assert not again.admitted()
        if not again.waiting():
            assert "retry-after" in again.shed()
        await a.close()
        await b.close()
    finally:
        for s in streams:
            s.close()
        for srv in servers:
            srv.close()
