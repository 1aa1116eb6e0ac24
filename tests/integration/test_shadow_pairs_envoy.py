"""Shadow traffic compared request by request (real Envoy, control plane, filter server with its
shadow recorder, rate-limit service, Redis, SGLang emulators): each sampled request's mirror
passes the recorder, which times the shadow pool's answer and reads its output tokens; the pair
(primary's side from the filter, shadow's from the recorder) lands in Redis and
``tokenweir shadow`` reports it. A failing, dead or over-bound shadow is a shadow error, the
primary's answers are untouched, and the tenant pays the primary alone."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.mesh_harness import eventually
from tests.integration.safety_stack import SafetyStack, backend_requests, safety_stack
from tokenweir.cli import main

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

PLUGINS = "identity, tokens, lane, shadow, usage"


def chat(text: str, stream: bool = True) -> bytes:
    body = {"model": "m1", "messages": [{"role": "user", "content": text}], "max_tokens": 20,
            "stream": stream}  # fmt: skip
    return json.dumps(body).encode()


async def call(st: SafetyStack, body: bytes) -> bytes:
    async with st.session.post(
        st.url + "/v1/chat/completions", data=body, headers=st.headers()
    ) as r:
        assert r.status == 200, await r.text()
        return await r.read()


async def report(st: SafetyStack) -> dict[str, Any]:
    out = io.StringIO()
    argv = ["shadow", "-c", str(st.mesh.policy_path), "--redis-url",
            str(st.app.settings.redis_url), "--json"]  # fmt: skip
    with contextlib.redirect_stdout(out):
        rc = await asyncio.to_thread(main, argv)
    assert rc == 0, out.getvalue()
    route: dict[str, Any] = json.loads(out.getvalue())["routes"]["llm"]
    return route


async def pairs_reach(st: SafetyStack, n: int) -> dict[str, Any]:
    async def count() -> int:
        return int((await report(st))["summary"]["pairs"])

    assert await eventually(count, n, timeout=60.0) == n
    return await report(st)


async def test_every_sampled_request_is_one_pair_with_both_sides_timed_and_counted(
    tmp_path: Path, redis_port: int
) -> None:
    async with safety_stack(tmp_path, redis_port, shadow_replicas=1, shadow_slow=20,
                            plugins=PLUGINS) as st:  # fmt: skip
        for i in range(4):
            got = await call(st, chat(f"pair {i}"))
            assert got.endswith(b"data: [DONE]\n\n") and b'"usage"' not in got
        assert json.loads(await call(st, chat("json pair", stream=False)))["usage"]
        rep = await pairs_reach(st, 5)
        s = rep["summary"]
        assert s["both_ok"] == 5 and s["primary"]["errors"] == 0 and s["shadow"]["errors"] == 0
        assert s["same_output_tokens"] == 5, rep  # same prompt, same max_tokens, no early stop
        for p in rep["pairs"]:
            assert p["primary"]["status"] == p["shadow"]["status"] == 200
            assert p["primary"]["completion_tokens"] == p["shadow"]["completion_tokens"] > 0
            assert p["request_id"]  # Envoy's x-request-id of the primary
        # the shadow pool is 20x slower per step: the pairs show it, the primaries never waited
        assert s["latency_ratio_p50"] > 1.5, s
        assert s["shadow"]["ttft_p50_s"] is not None
        assert await backend_requests(st.session, st.replicas[-1]) == 5
        assert st.metric("tokenweir_filters_shadow_pairs_total", route="llm") == 5
        assert st.metric("tokenweir_filters_shadow_same_output_tokens_total", route="llm") == 5
        used = sum(st.metric("tokenweir_filters_tokens_total", tenant="acme", model="m1", kind=k)
                   for k in ("prompt", "completion"))  # fmt: skip
        assert used > 0 and await st.settled("acme", 0) == used  # the mirrors cost nothing
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            argv = ["shadow", "-c", str(st.mesh.policy_path), "--redis-url",
                    str(st.app.settings.redis_url)]  # fmt: skip
            assert await asyncio.to_thread(main, argv) == 0
        assert "route llm: 5 pairs, both ok 5" in text.getvalue(), text.getvalue()


async def test_failing_dead_and_over_bound_shadows_are_shadow_errors_not_primary_ones(
    tmp_path: Path, redis_port: int
) -> None:
    async with safety_stack(tmp_path, redis_port, shadow_replicas=1, shadow_slow=40,
                            shadow_opts=", max_inflight: 1", plugins=PLUGINS) as st:  # fmt: skip
        shadow = st.replicas[-1]
        # over the bound: one mirror in flight (a slow one), the two beside it are dropped
        await asyncio.gather(*(call(st, chat(f"burst {i}")) for i in range(3)))
        rep = await pairs_reach(st, 3)
        assert rep["summary"]["shadow"]["errors_by_kind"] == {"dropped": 2}, rep["summary"]
        # a shadow answering 500
        async with st.session.post(f"http://127.0.0.1:{shadow}/_emulator/faults",
                                   json={"error_rate": 1.0, "slow": 1.0}) as r:  # fmt: skip
            assert r.status == 200
        for i in range(2):
            await call(st, chat(f"failing {i}"))
        rep = await pairs_reach(st, 5)
        assert rep["summary"]["shadow"]["errors_by_kind"] == {"dropped": 2, "status": 2}
        assert {p["shadow"]["status"] for p in rep["pairs"][:2]} == {500}
        # a dead shadow
        st.emulators[shadow].close()
        for i in range(2):
            await call(st, chat(f"dead {i}"))
        rep = await pairs_reach(st, 7)
        s = rep["summary"]
        assert s["shadow"]["errors_by_kind"] == {"connect": 2, "dropped": 2, "status": 2}, s
        assert s["primary"]["errors"] == 0 and s["both_ok"] == 1, s
        assert st.metric("tokenweir_filters_shadow_errors_total", route="llm", side="shadow",
                         kind="connect") == 2  # fmt: skip
