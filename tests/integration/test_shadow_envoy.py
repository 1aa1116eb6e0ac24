"""Shadow traffic end to end (real Envoy, control plane, filter server, rate-limit service,
Redis, SGLang emulators): every mirrored request reaches the shadow pool, the primary's answers
never wait for a slow shadow, the tenant is charged exactly what the primary produced (the
mirror costs nothing), and ``tokenweir status`` compares primary and shadow."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from tests.integration.mesh_harness import eventually
from tests.integration.safety_stack import backend_requests, safety_stack
from tokenweir.cli import main

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

BODY = json.dumps({"model": "m1", "messages": [{"role": "user", "content": "mirror me"}],
                   "max_tokens": 20, "stream": True}).encode()  # fmt: skip
_RUNNING = re.compile(r"^sglang:num_running_reqs\{[^}]*\}\s+([0-9.e+]+)$", re.M)


async def test_mirrored_requests_reach_the_shadow_cost_nothing_and_never_slow_the_primary(
    tmp_path: Path, redis_port: int
) -> None:
    async with safety_stack(tmp_path, redis_port, shadow_replicas=1, shadow_slow=300,
                            plugins="identity, tokens, lane, usage") as st:  # fmt: skip
        primary, shadow = st.replicas[0], st.replicas[-1]
        for _ in range(3):
            async with st.session.post(
                st.url + "/v1/chat/completions", data=BODY, headers=st.headers()
            ) as r:
                assert r.status == 200
                assert (await r.read()).endswith(b"data: [DONE]\n\n")
        # all three primary answers are complete while the slow shadow is still generating
        assert await backend_requests(st.session, primary) == 3
        assert await backend_requests(st.session, shadow) < 3
        async with st.session.get(f"http://127.0.0.1:{shadow}/metrics") as r:
            assert sum(float(v) for v in _RUNNING.findall(await r.text())) > 0

        async def shadow_done() -> int:
            return await backend_requests(st.session, shadow)

        assert await eventually(shadow_done, 3, timeout=60.0) == 3  # every mirror arrived
        used = sum(st.metric("tokenweir_filters_tokens_total", tenant="acme", model="m1", kind=k)
                   for k in ("prompt", "completion"))  # fmt: skip
        assert used > 0
        assert await st.settled("acme", 0) == used  # the primary's tokens, once: mirrors free
        port = st.mesh.plane.settings.metrics.port
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = await asyncio.to_thread(main, ["status", "--control-plane", f"127.0.0.1:{port}"])
        text = out.getvalue()
        assert rc == 0 and "(shadow)" in text and "(chat)" in text, text
        rows = {line.split()[1]: line.split() for line in text.splitlines()
                if line.startswith("llm ")}  # fmt: skip
        assert rows["shadow"][2] == "3" and rows["primary"][2] == "3", text
