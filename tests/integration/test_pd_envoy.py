"""A PD pool through the gateway: real Envoy, the filter server's ``pd`` plugin, one prefill
and two decode emulators (real processes).

- a request is served by a prefill/decode pair: both sides saw the same bootstrap fields (the
  prefill's host and bootstrap port, one room), the decode side's answer reached the client,
  the prefill computed the prompt;
- a failed prefill ends the request in a JSON error from the decode side (not a hang), counted
  as ``prefill_failed``, and the next request goes to a live prefill.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from filters.app import FilterApp, Settings
from tests.helpers import ChildProcess, free_port, wait_for_port
from tests.integration.mesh_harness import mesh

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _policy(gw: int, fp: int, prefill: list[tuple[int, int]], decode: list[int]) -> str:
    pre = ", ".join(f"{{address: 127.0.0.1:{p}, bootstrap_port: {b}}}" for p, b in prefill)
    dec = ", ".join(f"127.0.0.1:{p}" for p in decode)
    return f"""
version: 1
control_plane: {{xds: 127.0.0.1:1, metrics: 127.0.0.1:2}}
filters: {{address: 127.0.0.1:{fp}, message_timeout: 5s}}
pools:
  chat:
    models: [m1]
    health_check: {{interval: 200ms, timeout: 200ms, unhealthy_threshold: 1}}
    retries: {{num_retries: 0}}
    disaggregation:
      prefill: [{pre}]
      decode: [{dec}]
      eject_for: 30s
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes:
      - name: native
        match: {{prefix: /}}
        pool: chat
        filters: {{plugins: [{{name: identity, settings: {{require: false}}}}, tokens, pd, usage]}}
"""


def _emulator(tmp: Path, name: str, port: int, *extra: str) -> ChildProcess:
    argv = [sys.executable, "-m", "backends.emulator", "--port", str(port), "--model", "m1",
            "--profile", "seed-2k", "--time-scale", "0.02", "--log-level", "WARNING",
            "--disaggregation-timeout", "5", *extra]  # fmt: skip
    return ChildProcess(argv, log=tmp / f"{name}.log")


async def _until(check: Callable[[], bool], what: Callable[[], str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout}s: {what()}")
        await asyncio.sleep(0.05)


async def test_pd_pool_through_envoy_pairs_prefill_and_decode(tmp_path: Path) -> None:
    gw, fp = free_port(), free_port()
    prefill = [(free_port(), free_port()), (free_port(), free_port())]
    decode = [free_port(), free_port()]
    children = [
        _emulator(tmp_path, f"prefill{i}", p, "--disaggregation-mode", "prefill",
                  "--disaggregation-bootstrap-port", str(b))
        for i, (p, b) in enumerate(prefill)
    ] + [
        _emulator(tmp_path, f"decode{i}", p, "--disaggregation-mode", "decode")
        for i, p in enumerate(decode)
    ]  # fmt: skip
    app: FilterApp | None = None
    try:
        for port in [p for p, _ in prefill] + [b for _, b in prefill] + decode:
            await asyncio.to_thread(wait_for_port, port, 30.0)
        async with mesh(tmp_path, _policy(gw, fp, prefill, decode), {"edge": gw}) as m:
            app = FilterApp(Settings(policy_path=m.policy_path), clock=time.monotonic)
            await app.start()
            reg = app.metrics.registry

            def outcomes(outcome: str) -> float:
                v = reg.get_sample_value(
                    "tokenweir_pd_requests_total", {"pool": "chat", "outcome": outcome}
                )
                return v or 0.0

            async with aiohttp.ClientSession() as http:

                async def state(port: int) -> dict[str, Any]:
                    async with http.get(f"http://127.0.0.1:{port}/_emulator/state") as r:
                        return (await r.json())["disaggregation"]  # type: ignore[no-any-return]

                async def generate(text: str) -> tuple[int, dict[str, Any]]:
                    body = {"text": text, "sampling_params": {"max_new_tokens": 5}}
                    async with http.post(f"http://127.0.0.1:{gw}/generate", json=body) as r:
                        return r.status, await r.json(content_type=None)

                # Envoy's health checks find the decode replicas before traffic is sent
                status, answer = await generate("warm up " * 40)
                deadline = time.monotonic() + 20
                while status != 200 and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                    status, answer = await generate("warm up " * 40)
                assert status == 200, answer
                assert answer["meta_info"]["completion_tokens"] == 5
                await _until(lambda: outcomes("ok") >= 1, lambda: str(outcomes("ok")))

                # the bootstrap fields both sides saw: the same room, the prefill's host and
                # bootstrap port; decode answers, prefill computed the prompt (one token)
                pre = {p: await state(p) for p, _ in prefill}
                dec = {p: await state(p) for p in decode}
                rooms_p = [(p, r) for p, s in pre.items() for r in s["recent_rooms"]]
                rooms_d = [r for s in dec.values() for r in s["recent_rooms"]]
                assert len(rooms_p) == len(rooms_d) == 1
                (p_port, seen), (seen_d,) = rooms_p[0], rooms_d
                assert seen == seen_d
                assert seen["host"] == "127.0.0.1"
                assert seen["port"] == dict(prefill)[p_port]
                assert 0 <= seen["room"] < 2**63

                # a failed prefill: every prefill errors; the client gets the decode side's
                # JSON error at once, counted as prefill_failed
                for p, _ in prefill:
                    async with http.post(
                        f"http://127.0.0.1:{p}/_emulator/faults", json={"error_rate": 1.0}
                    ) as r:
                        assert r.status == 200
                status, answer = await generate("this one fails " * 20)
                assert status == 500, answer
                # the prefill's own error, not the 5 s bootstrap timeout's (read from the
                # message: a bound on the time is a loaded box's flake)
                assert "KV transfer from prefill" in answer["message"], answer
                assert "injected fault" in answer["message"]
                await _until(
                    lambda: outcomes("prefill_failed") >= 1, lambda: str(outcomes("prefill_failed"))
                )
                # that prefill replica is ejected: with the faults gone, the next request is
                # served by the other one
                states = {p: await state(p) for p, _ in prefill}
                (failed_port,) = [p for p, st in states.items() if st["transfers"]["failed"]]
                ok_before = {p: st["transfers"]["ok"] for p, st in states.items()}
                for p, _ in prefill:
                    async with http.post(
                        f"http://127.0.0.1:{p}/_emulator/faults", json={"error_rate": 0.0}
                    ) as r:
                        assert r.status == 200
                status, answer = await generate("this one fails " * 20)
                assert status == 200, answer
                after = {p: (await state(p))["transfers"]["ok"] for p, _ in prefill}
                assert after[failed_port] == ok_before[failed_port]
                assert sum(after.values()) == sum(ok_before.values()) + 1
    finally:
        if app is not None:
            await app.aclose()
        for c in children:
            c.close()
