"""What a client sees at the gateway when its request is bad or Envoy itself must answer: every
error is an answer (never a reset), OpenAI-style JSON with the right status, readable by the
official ``openai`` client; bad text never reaches a backend. Real Envoy, our control plane, the
filter server in process, a fake OpenAI backend and a slow plain HTTP service."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import openai
import pytest

from filters.app import FilterApp, Settings
from tests.filters.fake_openai import FakeOpenAI
from tests.helpers import free_port
from tests.integration.mesh_harness import Backend, mesh

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

KEY = "alice-key-123"
LIMIT = 64 * 1024


def policy_text(gw: int, fp: int, backend: FakeOpenAI, slow: Backend) -> str:
    return f"""
version: 1
control_plane: {{xds: 127.0.0.1:1, metrics: 127.0.0.1:2}}
filters: {{address: 127.0.0.1:{fp}, message_timeout: 2s, max_body_bytes: {LIMIT}}}
pools:
  chat:
    models: [m1]
    endpoints: [127.0.0.1:{backend.port}]
    health_check: {{enabled: false}}
    retries: {{enabled: false}}
services:
  slow:
    endpoints: [127.0.0.1:{slow.port}]
    timeouts: {{request: 300ms}}
    retries: {{enabled: false}}
    circuit_breakers: {{max_connections: 1, max_requests: 1, max_pending_requests: 1}}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    max_request_headers_kb: 16
    routes:
      - name: llm
        match: {{prefix: /v1/}}
        pool: chat
        filters: {{plugins: [identity, tokens, usage]}}
      - {{name: slow, service: slow, match: {{prefix: /slow/}}}}
tiers:
  pro: {{max_tokens: 64}}
tenants:
  alice: {{tier: pro, api_keys: [{KEY}]}}
"""


@dataclass
class Edge:
    gw: int
    backend: FakeOpenAI
    slow: Backend
    app: FilterApp

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.gw}"


@contextlib.asynccontextmanager
async def edge(tmp_path: Path, transport: str = "h2") -> AsyncIterator[Edge]:
    backend, slow = FakeOpenAI(name="b0"), Backend("slow", delay=1.0)
    await backend.start()
    await slow.start()
    gw, fp = free_port(), free_port()
    app: FilterApp | None = None
    try:
        async with mesh(tmp_path, policy_text(gw, fp, backend, slow), {"edge": gw}) as m:
            settings = Settings(policy_path=m.policy_path, transport=transport)
            app = FilterApp(settings, clock=time.monotonic)
            await app.start()
            yield Edge(gw, backend, slow, app)
    finally:
        if app is not None:
            await app.aclose()
        await backend.aclose()
        await slow.aclose()


def raw_exchange(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    """Send ``data`` on a fresh connection; everything the gateway answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        with contextlib.suppress(OSError):  # an early answer may stop the gateway reading
            s.sendall(data)
        out = b""
        while not _complete(out) and (chunk := s.recv(65536)):
            out += chunk
        return out


def _complete(answer: bytes) -> bool:
    head, sep, body = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


def parse(answer: bytes) -> tuple[int, dict[str, str], dict]:  # type: ignore[type-arg]
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


def assert_openai_error(status: int, headers: dict[str, str], body: dict, want: int) -> None:  # type: ignore[type-arg]
    assert status == want, (status, body)
    assert headers["content-type"].startswith("application/json"), headers
    assert body["error"]["message"] and body["error"]["type"], body


@pytest.mark.parametrize("transport", ["h2", "grpc"])
async def test_a_too_large_body_is_answered_413_for_the_openai_client(
    tmp_path: Path, transport: str
) -> None:
    async with edge(tmp_path, transport) as e:
        big = "x " * 2_000_000  # 4 MB, 64x the route's limit
        async with openai.AsyncOpenAI(base_url=e.url + "/v1", api_key=KEY, max_retries=0) as c:
            with pytest.raises(openai.APIStatusError) as info:
                await c.chat.completions.create(
                    model="m1", messages=[{"role": "user", "content": big}]
                )
        assert info.value.status_code == 413
        assert "this route accepts" in info.value.message
        # the filter server read the body to its end before answering (else: a reset)
        drained = e.app.metrics.registry.get_sample_value(
            "tokenweir_filters_rejections_total",
            {"route": "oversize", "reason": "too_large", "status": "413"},
        )
        assert drained == 1

        def sync_call() -> openai.APIStatusError:
            huge = [{"role": "user", "content": "x " * 4_000_000}]  # 8 MB
            with (
                openai.OpenAI(base_url=e.url + "/v1", api_key=KEY, max_retries=0) as c,
                pytest.raises(openai.APIStatusError) as info,
            ):
                c.chat.completions.create(model="m1", messages=huge)
            return info.value

        err = await asyncio.to_thread(sync_call)
        assert err.status_code == 413 and "larger than this route accepts" in err.message
        # without a content-length Envoy's own buffer limit answers: JSON too
        answer = await asyncio.to_thread(
            raw_exchange,
            e.gw,
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"authorization: Bearer {KEY}\r\ntransfer-encoding: chunked\r\n\r\n".encode()
            + b"".join(b"%x\r\n%s\r\n" % (8192, b"y" * 8192) for _ in range(16))
            + b"0\r\n\r\n",
        )
        assert_openai_error(*parse(answer), want=413)
        assert e.backend.seen == []


async def test_bad_text_and_empty_bodies_get_400_and_never_reach_a_backend(
    tmp_path: Path,
) -> None:
    async with edge(tmp_path) as e, aiohttp.ClientSession() as s:
        url = e.url + "/v1/chat/completions"
        auth = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
        lone = json.dumps({"model": "m1", "messages": [{"role": "user", "content": "\ud800"}]})
        bodies = [lone.encode()] * 5 + [
            b'{"model":"m1","messages":[{"role":"user","content":"\xed\xa0\x80"}]}',
            b"",
        ]
        for body in bodies:
            async with s.post(url, data=body, headers=auth) as r:
                got = await r.json(content_type=None)
                assert_openai_error(r.status, _lower(r.headers), got, want=400)
                assert got["error"]["type"] == "invalid_request_error", got
        async with openai.AsyncOpenAI(base_url=e.url + "/v1", api_key=KEY, max_retries=0) as c:
            ok = await c.chat.completions.create(
                model="m1", messages=[{"role": "user", "content": "hi \U0001f600"}]
            )
        assert ok.choices[0].message.content
        assert len(e.backend.seen) == 1, "bad input reached the backend"


async def test_envoys_own_replies_are_openai_json(tmp_path: Path) -> None:
    async with edge(tmp_path) as e, aiohttp.ClientSession() as s:
        # a header line with a space before the colon: a 400, not a silent close
        answer = await asyncio.to_thread(
            raw_exchange,
            e.gw,
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nfoo : bar\r\ncontent-length: 2\r\n\r\n{}",
        )
        assert_openai_error(*parse(answer), want=400)
        # headers larger than max_request_headers_kb
        async with s.get(e.url + "/slow/x", headers={"x-big": "z" * 20_000}) as r:
            assert_openai_error(r.status, _lower(r.headers), await r.json(), want=431)
        async with s.get(e.url + "/nowhere") as r:
            assert_openai_error(r.status, _lower(r.headers), await r.json(), want=404)
        # the service takes 1 s, its route allows 300 ms
        async with s.get(e.url + "/slow/x") as r:
            assert_openai_error(r.status, _lower(r.headers), await r.json(), want=504)
        # one request at a time: the others overflow the circuit breaker at once
        results = await asyncio.gather(*(_get(s, e.url + "/slow/y") for _ in range(4)))
        overflow = [r for r in results if r[1].get("x-envoy-overloaded")]
        assert overflow, results
        for status, headers, body in overflow:
            assert_openai_error(status, headers, body, want=503)
            assert headers["retry-after"] == "1"


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


async def _get(s: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, str], dict]:  # type: ignore[type-arg]
    async with s.get(url) as r:
        return r.status, {k.lower(): v for k, v in r.headers.items()}, await r.json()
