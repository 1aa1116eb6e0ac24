"""Real Envoy fed by our control plane: health checks, retries to another replica, the
fallback pool, and endpoints files rewritten by other tools."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import pytest

from tests.helpers import free_port
from tests.integration.mesh_harness import Backend, close_backends, eventually, mesh, start_backends

pytestmark = pytest.mark.integration


def _eps(bs: list[Backend]) -> str:
    return ", ".join(f"127.0.0.1:{b.port}" for b in bs)


async def test_active_health_check_removes_and_restores_a_replica(tmp_path: Path) -> None:
    bs = await start_backends(2)
    gw = free_port()
    text = f"""
version: 1
pools:
  chat:
    models: [m]
    endpoints: [{_eps(bs)}]
    health_check: {{interval: 100ms, timeout: 100ms, unhealthy_threshold: 1, healthy_threshold: 1}}
    outlier_detection: {{enabled: false}}
    retries: {{enabled: false}}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes: [{{name: chat, pool: chat}}]
"""
    try:
        async with mesh(tmp_path, text, {"edge": gw}) as m:

            async def seen() -> set[str]:
                return {
                    (await m.get(gw, "/x", {"x-session-id": f"s{i}"}))[1]["x-backend"]
                    for i in range(40)
                }

            assert await eventually(seen, {"b0", "b1"}) == {"b0", "b1"}
            bs[0].health_status = 503
            assert await eventually(seen, {"b1"}) == {"b1"}, (
                "a replica failing /health gets no traffic"
            )
            bs[0].health_status = 200
            assert await eventually(seen, {"b0", "b1"}) == {"b0", "b1"}
    finally:
        await close_backends(bs)


async def test_503_is_retried_on_another_replica(tmp_path: Path) -> None:
    bs = await start_backends(3)
    bs[0].status = 503
    gw = free_port()
    text = f"""
version: 1
pools:
  chat:
    models: [m]
    endpoints: [{_eps(bs)}]
    health_check: {{enabled: false}}
    outlier_detection: {{enabled: false}}
    retries: {{num_retries: 2, retriable_status_codes: [503], backoff_base: 5ms, backoff_max: 20ms}}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes: [{{name: chat, pool: chat}}]
"""
    try:
        async with mesh(tmp_path, text, {"edge": gw}) as m:
            results = [await m.get(gw, "/x", {"x-session-id": f"s{i}"}) for i in range(40)]
            assert all(s == 200 for s, _, _ in results), collections.Counter(
                s for s, _, _ in results
            )
            assert bs[0].hits > 0, "some sessions hash to the failing replica first"
            assert "b0" not in {h["x-backend"] for _, h, _ in results}
    finally:
        await close_backends(bs)


async def test_fallback_pool_takes_over_when_the_pool_has_no_healthy_replica(
    tmp_path: Path,
) -> None:
    main, spare = await start_backends(2, "main"), await start_backends(1, "spare")
    gw = free_port()
    text = f"""
version: 1
pools:
  chat:
    models: [m]
    endpoints: [{_eps(main)}]
    fallback: spare
    health_check: {{interval: 100ms, timeout: 100ms, unhealthy_threshold: 1, healthy_threshold: 1}}
    retries: {{enabled: false}}
  spare:
    models: [m]
    endpoints: [{_eps(spare)}]
    health_check: {{interval: 100ms, timeout: 100ms}}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes: [{{name: chat, pool: chat}}]
"""
    try:
        async with mesh(tmp_path, text, {"edge": gw}) as m:

            async def seen() -> tuple[frozenset[str], bool]:
                res = [await m.get(gw, "/x", {"x-session-id": f"s{i}"}) for i in range(20)]
                return frozenset(h.get("x-backend", "") for _, h, _ in res), all(
                    s == 200 for s, _, _ in res
                )

            # Steady states are asserted; the moments of a health flip may see a few 503s
            # ("no healthy upstream") while the aggregate cluster catches up.
            main_ok = (frozenset({"main0", "main1"}), True)
            assert await eventually(seen, main_ok) == main_ok
            for b in main:
                b.health_status = 503
            spare_ok = (frozenset({"spare0"}), True)
            assert await eventually(seen, spare_ok) == spare_ok
            for b in main:
                b.health_status = 200
            assert await eventually(seen, main_ok) == main_ok
    finally:
        await close_backends(main + spare)


async def test_rewritten_endpoints_file_reaches_envoy(tmp_path: Path) -> None:
    bs = await start_backends(2)
    gw = free_port()
    eps_file = tmp_path / "chat.endpoints"
    eps_file.write_text(f"# written by a launcher\n127.0.0.1:{bs[0].port}\n")
    text = f"""
version: 1
pools:
  chat:
    models: [m]
    endpoints_file: chat.endpoints
    health_check: {{enabled: false}}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes: [{{name: chat, pool: chat}}]
"""
    try:
        async with mesh(tmp_path, text, {"edge": gw}) as m:
            seen = {
                (await m.get(gw, "/x", {"x-session-id": f"s{i}"}))[1]["x-backend"]
                for i in range(10)
            }
            assert seen == {"b0"}
            tmp = tmp_path / "chat.endpoints.tmp"
            tmp.write_text(f"127.0.0.1:{bs[0].port}\n127.0.0.1:{bs[1].port}\n")
            tmp.replace(eps_file)
            deadline = asyncio.get_running_loop().time() + 10
            seen = set()
            while seen != {"b0", "b1"} and asyncio.get_running_loop().time() < deadline:
                seen |= {
                    (await m.get(gw, "/x", {"x-session-id": f"s{i}"}))[1]["x-backend"]
                    for i in range(20)
                }
            assert seen == {"b0", "b1"}
            # A broken line is rejected with file:line; the two replicas keep serving.
            eps_file.write_text("127.0.0.1:1\nnot-a-host-port\n")
            await asyncio.sleep(0.5)
            errors = m.plane.registry.get_sample_value(
                "tokenweir_config_reloads_total", {"result": "error"}
            )
            assert errors is not None and errors >= 1
            seen = {
                (await m.get(gw, "/x", {"x-session-id": f"s{i}"}))[1]["x-backend"]
                for i in range(20)
            }
            assert seen == {"b0", "b1"}
    finally:
        await close_backends(bs)
