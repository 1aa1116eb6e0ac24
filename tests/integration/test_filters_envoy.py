"""The filter server in front of real Envoy, configured by our control plane: identity, clamp,
usage chunk handling, bad input, prefix affinity, and the official openai client."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
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
from tests.integration.mesh_harness import Mesh, mesh

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ALICE, BOB = "alice-key-123", "bob-key-1234"


def policy_text(gw: int, filters_port: int, backends: list[FakeOpenAI], extra: str = "") -> str:
    eps = ", ".join(f"127.0.0.1:{b.port}" for b in backends)
    return f"""
version: 1
control_plane: {{xds: 127.0.0.1:1, metrics: 127.0.0.1:2}}
filters: {{address: 127.0.0.1:{filters_port}, message_timeout: 2s, max_body_bytes: 64KiB}}
pools:
  chat:
    models: [m1]
    endpoints: [{eps}]
    health_check: {{enabled: false}}
    retries: {{enabled: false}}
    affinity: {{prefix_tokens: 64, hash_balance_factor: null}}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes:
      - name: llm
        match: {{prefix: /v1/}}
        pool: chat
        filters: {{plugins: [identity, tokens, prefix, lane, usage]}}
      - name: generate
        match: {{path: /generate}}
        pool: chat
        filters: {{plugins: [identity, tokens, prefix, lane, usage]}}
{extra}
tiers:
  free: {{lane: batch, allowed_lanes: [batch], max_tokens: 8}}
  pro: {{lane: interactive, max_tokens: 64}}
tenants:
  alice: {{tier: pro, api_keys: [{ALICE}]}}
  bob: {{tier: free, api_keys: [{BOB}]}}
"""


@dataclass
class Stack:
    mesh: Mesh
    app: FilterApp
    backends: list[FakeOpenAI]
    gw: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.gw}"

    def seen(self) -> list[tuple[dict[str, str], dict[str, object]]]:
        return [s for b in self.backends for s in b.seen]


@pytest.fixture(params=["grpc", "h2"])
def transport(request: pytest.FixtureRequest) -> str:
    """The filter server's transport (``--transport``): every test runs on both."""
    return str(request.param)


@contextlib.asynccontextmanager
async def stack(tmp_path: Path, transport: str, replicas: int = 1) -> AsyncIterator[Stack]:
    backends = [FakeOpenAI(name=f"b{i}") for i in range(replicas)]
    for b in backends:
        await b.start()
    gw, fp = free_port(), free_port()
    app: FilterApp | None = None
    try:
        async with mesh(tmp_path, policy_text(gw, fp, backends), {"edge": gw}) as m:
            app = FilterApp(
                Settings(policy_path=m.policy_path, transport=transport), clock=time.monotonic
            )
            await app.start()
            yield Stack(m, app, backends, gw)
    finally:
        if app is not None:
            await app.aclose()
        for b in backends:
            await b.aclose()


async def post(
    s: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> tuple[int, Mapping[str, str], bytes]:
    async with s.post(url, data=body, headers=headers) as r:
        return r.status, r.headers.copy(), await r.read()


def chat(content: str = "hello", **kw: object) -> bytes:
    return json.dumps(
        {"model": "m1", "messages": [{"role": "user", "content": content}], **kw}
    ).encode()


async def test_openai_client_identity_clamp_and_usage(tmp_path: Path, transport: str) -> None:
    async with stack(tmp_path, transport) as st:
        async with openai.AsyncOpenAI(base_url=st.url + "/v1", api_key=ALICE) as client:
            r = await client.chat.completions.create(
                model="m1", messages=[{"role": "user", "content": "hi"}], max_tokens=1000
            )
            assert r.usage is not None and r.usage.completion_tokens == 5
            headers, body = st.seen()[-1]
            assert body["max_tokens"] == 64  # pro tier cap
            assert headers["x-tokenweir-tenant"] == "alice"
            assert headers["x-tokenweir-lane"] == "interactive"
            assert "authorization" not in headers and "x-prefix-hash" in headers

            stream = await client.chat.completions.create(
                model="m1", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            chunks = [c async for c in stream]
            assert all(c.usage is None for c in chunks)  # the forced usage chunk was cut
            assert (
                "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "w " * 5
            )
            assert st.seen()[-1][1]["stream_options"] == {"include_usage": True}

            stream = await client.chat.completions.create(
                model="m1",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [c async for c in stream]
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5

        async with openai.AsyncOpenAI(base_url=st.url + "/v1", api_key="wrong-key-999") as bad:
            with pytest.raises(openai.AuthenticationError):
                await bad.chat.completions.create(
                    model="m1", messages=[{"role": "user", "content": "x"}]
                )

        m = st.app.metrics.registry
        labels = {"tenant": "alice", "model": "m1", "kind": "completion"}
        for _ in range(50):  # counted when each gRPC stream closes, a moment after the answer
            if m.get_sample_value("tokenweir_filters_tokens_total", labels) == 15:
                break
            await asyncio.sleep(0.05)
        assert m.get_sample_value("tokenweir_filters_tokens_total", labels) == 15

        def total(name: str) -> float:  # over every lane and outcome, alice's samples
            return sum(
                s.value
                for fam in m.collect()
                for s in fam.samples
                if s.name == name and s.labels.get("tenant") == "alice"
            )

        # measured in Envoy (the Lua usage meter), recorded here from the gRPC access log: a
        # time to first token for each answer (chunk gaps depend on how the backend's writes
        # coalesce: tests/integration/test_usage_twin.py and tests/filters/test_usage_log.py)
        assert total("tokenweir_filters_ttft_seconds_count") >= 3
        assert total("tokenweir_filters_requests_total") >= 3


async def test_spoofed_internal_headers_are_ignored(tmp_path: Path, transport: str) -> None:
    async with stack(tmp_path, transport) as st, aiohttp.ClientSession() as s:
        spoof = {
            "authorization": f"Bearer {BOB}",
            "content-type": "application/json",
            "x-tokenweir-tenant": "alice",
            "x-tokenweir-tier": "pro",
            "x-tokenweir-lane": "interactive",
            "x-tokenweir-reserve": "1",
        }
        status, _, _ = await post(s, st.url + "/v1/chat/completions", chat(max_tokens=500), spoof)
        assert status == 200
        headers, body = st.seen()[-1]
        assert headers["x-tokenweir-tenant"] == "bob" and headers["x-tokenweir-tier"] == "free"
        assert headers["x-tokenweir-lane"] == "batch"
        assert body["max_tokens"] == 8
        assert int(headers["x-tokenweir-reserve"]) > 8


async def test_bad_input_gets_openai_errors_and_next_request_works(
    tmp_path: Path, transport: str
) -> None:
    async with stack(tmp_path, transport) as st, aiohttp.ClientSession() as s:
        url = st.url + "/v1/chat/completions"
        auth = {"authorization": f"Bearer {ALICE}", "content-type": "application/json"}
        cases = [
            (b"{nope", auth, 400),
            (b'{"model":"m1","messages":[{"role":"user","content":"\xff"}]}', auth, 400),
            (chat(n=3), auth, 400),
            (chat(max_tokens=-1), auth, 400),
            (chat(max_tokens=10**9), auth, 400),
            (chat(weird_field=True), auth, 400),
            (chat(), {**auth, "content-type": "text/plain"}, 415),
            (chat("x " * 40_000), auth, 413),
            (chat(), {"content-type": "application/json"}, 401),
        ]
        for body, headers, expected in cases:
            status, rh, text = await post(s, url, body, headers)
            assert status == expected, (body[:60], status, text[:200], rh)
            err = json.loads(text)["error"]
            assert err["message"] and rh["content-type"].startswith("application/json"), rh
        assert st.seen() == []  # nothing bad reached the backend
        status, _, _ = await post(s, url, chat(), auth)
        assert status == 200
        rejected = st.app.metrics.registry.get_sample_value(
            "tokenweir_filters_rejections_total", {"route": "llm", "reason": "n_gt_1", "status": "400"}
        )  # fmt: skip
        assert rejected == 1


async def test_conversations_and_shared_prefixes_stay_on_one_replica(
    tmp_path: Path, transport: str
) -> None:
    async with stack(tmp_path, transport, replicas=3) as st, aiohttp.ClientSession() as s:
        url = st.url + "/v1/chat/completions"
        auth = {"authorization": f"Bearer {ALICE}", "content-type": "application/json"}
        system = {"role": "system", "content": "You are a helpful assistant."}
        homes: dict[int, set[str]] = collections.defaultdict(set)
        for conv in range(12):
            msgs = [system, {"role": "user", "content": f"conversation {conv}: tell me a story"}]
            for turn in range(3):
                body = json.dumps({"model": "m1", "messages": msgs, "max_tokens": 4}).encode()
                status, h, _ = await post(s, url, body, auth)
                assert status == 200
                homes[conv].add(h["x-backend"])
                msgs = [*msgs, {"role": "assistant", "content": "w w w w"},
                        {"role": "user", "content": f"turn {turn} more"}]  # fmt: skip
        assert all(len(v) == 1 for v in homes.values()), homes
        assert len({next(iter(v)) for v in homes.values()}) >= 2, "one system prompt piled up"
        doc = "The weir keeps the river steady. " * 60
        docs = set()
        for q in range(6):
            body = chat(doc + f"Question {q}?", max_tokens=4)
            status, h, _ = await post(s, url, body, auth)
            docs.add(h["x-backend"])
        assert len(docs) == 1
