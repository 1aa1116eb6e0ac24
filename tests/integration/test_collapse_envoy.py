"""Request collapsing end to end (real Envoy, Redis, rate-limit service, filter server, SGLang
emulator): identical deterministic streams in flight are one backend request (the emulator's
counter) and every caller gets a byte-identical stream, live (followers joined mid-stream get it
from the first byte); each caller is charged what it received; non-deterministic requests and
other tenants' requests are never collapsed."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from tests.integration.safety_stack import SafetyStack, safety_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

PLUGINS = "identity, tokens, collapse, lane, usage"


def chat(text: str, **extra: object) -> bytes:
    body = {"model": "m1", "messages": [{"role": "user", "content": text}], "max_tokens": 40,
            "stream": True, **extra}  # fmt: skip
    return json.dumps(body).encode()


async def stream(st: SafetyStack, body: bytes, tenant: str = "acme") -> bytes:
    async with st.session.post(
        st.url + "/v1/chat/completions", data=body, headers=st.headers(tenant)
    ) as r:
        assert r.status == 200, await r.text()
        return await r.read()


async def test_identical_deterministic_streams_are_one_backend_request(
    tmp_path: Path, redis_port: int
) -> None:
    async with safety_stack(tmp_path, redis_port, slow=40, plugins=PLUGINS) as st:
        body = chat("collapse me", temperature=0)
        before = await st.backend_requests()
        async with st.session.post(
            st.url + "/v1/chat/completions", data=body, headers=st.headers()
        ) as lead:
            assert lead.status == 200
            first_line = await lead.content.readline()  # the leader is streaming
            followers = [asyncio.create_task(stream(st, body)) for _ in range(3)]
            leader_bytes = first_line + await lead.read()
        got = await asyncio.gather(*followers)
        assert all(g == leader_bytes for g in got), "collapsed streams differ"
        assert leader_bytes.endswith(b"data: [DONE]\n\n") and b'"usage"' not in leader_bytes
        await asyncio.sleep(0.5)
        assert await st.backend_requests() == before + 1
        assert st.metric("tokenweir_filters_collapsed_total", route="llm", role="follower") == 3
        saved = st.metric("tokenweir_filters_backend_tokens_saved_total", route="llm",
                          how="collapse")  # fmt: skip
        assert saved > 0 and saved % 3 == 0
        # each of the 4 callers is charged what it received: the same usage, 4 times
        spent = await st.settled("acme", 0)
        assert spent == saved // 3 * 4, (spent, saved)


async def test_random_sampling_and_other_tenants_are_not_collapsed(
    tmp_path: Path, redis_port: int
) -> None:
    async with safety_stack(tmp_path, redis_port, slow=20, plugins=PLUGINS) as st:
        before = await st.backend_requests()
        hot = chat("sampled", temperature=0.7)
        await asyncio.gather(*(stream(st, hot) for _ in range(2)))
        same = chat("same text", seed=11)
        await asyncio.gather(stream(st, same, "acme"), stream(st, same, "globex"))
        await asyncio.sleep(0.5)
        assert await st.backend_requests() == before + 4
        assert st.metric("tokenweir_filters_collapsed_total", route="llm", role="follower") == 0


async def test_a_leader_gone_mid_stream_leaves_its_followers_a_complete_stream(
    tmp_path: Path, redis_port: int
) -> None:
    async with safety_stack(tmp_path, redis_port, slow=150, plugins=PLUGINS) as st:
        body = chat("the leader leaves", temperature=0)
        before = await st.backend_requests()
        lead = await st.session.post(
            st.url + "/v1/chat/completions", data=body, headers=st.headers()
        )
        assert lead.status == 200
        got_by_leader = await lead.content.readline()  # the leader is streaming
        followers = [asyncio.create_task(stream(st, body)) for _ in range(3)]
        await asyncio.sleep(0.3)  # the followers are attached and reading
        lead.close()  # the leader's client goes away mid-stream
        got = await asyncio.gather(*followers)  # about 1 s after the leader left
        assert got[0].startswith(got_by_leader) and len(got[0]) > len(got_by_leader)
        assert all(g == got[0] for g in got), "followers' streams differ"
        assert got[0].endswith(b"data: [DONE]\n\n") and b"collapsed_leader_failed" not in got[0]
        await asyncio.sleep(0.5)
        assert await st.backend_requests() == before + 1  # one backend request, run to its end
        # each is charged what it received: three whole answers, and the leader's part
        saved = st.metric("tokenweir_filters_backend_tokens_saved_total", route="llm",
                          how="collapse")  # fmt: skip
        whole = saved // 3
        spent = await st.settled("acme", 0)
        # the leader's part, with no usage of the backend's: its prompt at the bound it was
        # reserved at (bytes + 4 a message + 64 a chat request: docs/quotas.md) + its events
        bound = len("the leader leaves") + 4 + 64
        assert 3 * whole < spent < 3 * whole + bound + whole, (spent, whole)


async def test_identical_requests_on_two_filter_processes_are_one_backend_request(
    tmp_path: Path, redis_port: int
) -> None:
    async with safety_stack(tmp_path, redis_port, slow=60, plugins=PLUGINS,
                            filter_replicas=2) as st:  # fmt: skip
        body = chat("collapse me across processes", temperature=0)
        for _ in range(20):  # until Envoy's workers send ext_proc streams to both servers
            text = await st.mesh.clusters_text("edge")
            if len(re.findall(r"^tokenweir_filters::\S+::rq_total::[1-9]", text, re.M)) == 2:
                break
            await stream(st, chat("warm up", max_tokens=1))
        here_before = st.metric("tokenweir_filters_streams_total", route="llm")
        before = await st.backend_requests()
        async with st.session.post(
            st.url + "/v1/chat/completions", data=body, headers=st.headers()
        ) as lead:
            assert lead.status == 200
            first_line = await lead.content.readline()
            followers = [asyncio.create_task(stream(st, body)) for _ in range(5)]
            leader_bytes = first_line + await lead.read()
        got = await asyncio.gather(*followers)
        assert all(g == leader_bytes for g in got), "collapsed streams differ"
        assert leader_bytes.endswith(b"data: [DONE]\n\n")
        await asyncio.sleep(0.5)
        # Envoy spread the six ext_proc streams over both filter servers (this process saw
        # only some of them), and still the backend ran once
        here = st.metric("tokenweir_filters_streams_total", route="llm") - here_before
        assert 0 < here < 6, here
        assert await st.backend_requests() == before + 1
