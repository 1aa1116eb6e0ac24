"""Real Envoy fed by our control plane: affinity, ejection, timeouts, circuit breakers, live
endpoint edits, sidecars and bad edits."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import pytest

from tests.helpers import free_port
from tests.integration.mesh_harness import Backend, close_backends, mesh, start_backends

pytestmark = pytest.mark.integration


def _pool_policy(
    gw_port: int, backends: list[Backend], extra_pool: str = "", extra: str = ""
) -> str:
    eps = ", ".join(f"127.0.0.1:{b.port}" for b in backends)
    return f"""
version: 1
control_plane: {{xds: 127.0.0.1:1, metrics: 127.0.0.1:2}}
pools:
  chat:
    models: [m]
    endpoints: [{eps}]
    health_check: {{enabled: false}}
    retries: {{enabled: false}}
{extra_pool}
gateways:
  edge:
    listen: 127.0.0.1:{gw_port}
    routes:
      - name: chat
        pool: chat
{extra}
"""


async def test_session_and_prefix_affinity(tmp_path: Path) -> None:
    bs = await start_backends(3)
    gw = free_port()
    try:
        async with mesh(tmp_path, _pool_policy(gw, bs), {"edge": gw}) as m:
            homes: dict[str, set[str]] = collections.defaultdict(set)
            for rnd in range(3):
                for s in range(30):
                    _, h, _ = await m.get(
                        gw,
                        "/v1/chat/completions",
                        {"x-session-id": f"s{s}", "x-prefix-hash": f"p{rnd}"},
                    )
                    homes[f"s{s}"].add(h["x-backend"])
            assert all(len(v) == 1 for v in homes.values()), "a session moved between replicas"
            spread = collections.Counter(next(iter(v)) for v in homes.values())
            assert len(spread) == 3, f"30 sessions should use all 3 replicas, got {spread}"
            by_prefix: dict[str, set[str]] = collections.defaultdict(set)
            for p in range(20):
                for _ in range(3):
                    _, h, _ = await m.get(gw, "/v1/x", {"x-prefix-hash": f"prefix-{p}"})
                    by_prefix[f"prefix-{p}"].add(h["x-backend"])
            assert all(len(v) == 1 for v in by_prefix.values())
            assert len({next(iter(v)) for v in by_prefix.values()}) >= 2
    finally:
        await close_backends(bs)


async def test_failing_backend_is_ejected_then_comes_back(tmp_path: Path) -> None:
    bs = await start_backends(3)
    gw = free_port()
    od = "    outlier_detection: {consecutive_5xx: 3, consecutive_gateway_errors: 3, interval: 100ms, base_ejection_time: 2s, max_ejection_percent: 50}"
    try:
        async with mesh(tmp_path, _pool_policy(gw, bs, od), {"edge": gw}) as m:
            bs[0].status = 500
            statuses = [(await m.get(gw, "/x", {"x-session-id": f"s{i}"}))[0] for i in range(60)]
            failures = statuses.count(500)
            assert 3 <= failures <= 10, (
                f"the bad replica should fail about 3 times before ejection, failed {failures}"
            )
            after = [(await m.get(gw, "/x", {"x-session-id": f"s{i}"})) for i in range(30)]
            assert all(s == 200 for s, _, _ in after), (
                "traffic should have moved off the ejected replica"
            )
            assert "b0" not in {h["x-backend"] for _, h, _ in after}
            bs[0].status = 200
            await asyncio.sleep(3.0)  # base ejection time 2 s
            back = {
                (await m.get(gw, "/x", {"x-session-id": f"s{i}"}))[1]["x-backend"]
                for i in range(60)
            }
            assert "b0" in back, "the replica should return after the ejection time"
    finally:
        await close_backends(bs)


async def test_slow_backend_times_out_with_504(tmp_path: Path) -> None:
    bs = await start_backends(1)
    bs[0].delay = 2.0
    gw = free_port()
    try:
        async with mesh(
            tmp_path, _pool_policy(gw, bs, "    timeouts: {request: 300ms}"), {"edge": gw}
        ) as m:
            status, _, body = await m.get(gw, "/x")
            assert status == 504 and "timeout" in body
    finally:
        await close_backends(bs)


async def test_circuit_breakers_cut_batch_first_and_keep_interactive(tmp_path: Path) -> None:
    bs = await start_backends(1)
    bs[0].delay = 1.0
    gw = free_port()
    breakers = (
        "    circuit_breakers:\n"
        "      interactive: {max_connections: 16, max_pending_requests: 16, max_requests: 16}\n"
        "      batch: {max_connections: 2, max_pending_requests: 2, max_requests: 2}"
    )
    routes = "      - {name: hi, pool: chat, lane: interactive, match: {prefix: /, headers: {x-lane: interactive}}}"
    text = _pool_policy(gw, bs, breakers).replace("    routes:\n", "    routes:\n" + routes + "\n")
    try:
        async with mesh(tmp_path, text, {"edge": gw}) as m:

            async def burst(lane: str, n: int) -> list[tuple[int, dict[str, str]]]:
                hdr = {"x-lane": lane} if lane == "interactive" else {}
                res = await asyncio.gather(*(m.get(gw, f"/{lane}/{i}", hdr) for i in range(n)))
                return [(s, h) for s, h, _ in res]

            batch, inter = await asyncio.gather(burst("batch", 6), burst("interactive", 6))
            b_ok = sum(s == 200 for s, _ in batch)
            b_shed = [h for s, h in batch if s == 503]
            assert 1 <= b_ok <= 4 and len(b_shed) == 6 - b_ok, [s for s, _ in batch]
            assert all(h.get("x-envoy-overloaded") == "true" for h in b_shed)
            assert all(s == 200 for s, _ in inter), "interactive keeps its larger thresholds"
    finally:
        await close_backends(bs)


@pytest.mark.parametrize("delta", [True, False], ids=["delta", "sotw"])
async def test_endpoint_edits_while_traffic_flows_fail_nothing(tmp_path: Path, delta: bool) -> None:
    bs = await start_backends(3)
    gw = free_port()
    try:
        async with mesh(tmp_path, _pool_policy(gw, bs[:2]), {"edge": gw}, delta=delta) as m:
            results: list[int] = []
            seen: set[str] = set()
            stop = asyncio.Event()

            async def loop() -> None:
                i = 0
                while not stop.is_set():
                    s, h, _ = await m.get(gw, "/x", {"x-session-id": f"s{i % 50}"})
                    results.append(s)
                    seen.add(h.get("x-backend", "?"))
                    i += 1

            task = asyncio.create_task(loop())
            await asyncio.sleep(0.5)
            m.write_policy(_pool_policy(gw, bs))  # add b2
            await m.wait_applied(lambda: "b2" in seen)
            m.write_policy(_pool_policy(gw, bs[1:]))  # remove b0
            await asyncio.sleep(1.0)
            seen.clear()
            await asyncio.sleep(1.0)
            stop.set()
            await task
            assert results and all(s == 200 for s in results), collections.Counter(results)
            assert seen == {"b1", "b2"}
    finally:
        await close_backends(bs)


async def test_bad_edit_is_rejected_and_last_good_config_serves(tmp_path: Path) -> None:
    bs = await start_backends(2)
    gw = free_port()
    try:
        async with mesh(tmp_path, _pool_policy(gw, bs), {"edge": gw}) as m:
            before = m.plane.cache.get("edge")
            assert before is not None
            bad = (Path(__file__).parents[1] / "policy/bad/dangling_pool.yaml").read_text()
            m.write_policy(bad)
            await asyncio.sleep(0.6)
            assert m.plane.cache.get("edge") is before
            metrics = m.plane.registry.get_sample_value(
                "tokenweir_config_reloads_total", {"result": "error"}
            )
            assert metrics is not None and metrics >= 1
            statuses = [(await m.get(gw, "/x", {"x-session-id": f"s{i}"}))[0] for i in range(10)]
            assert statuses == [200] * 10
            m.write_policy(_pool_policy(gw, bs[:1]))
            await m.wait_applied(lambda: m.plane.cache.get("edge") is not before)
    finally:
        await close_backends(bs)


async def test_ordinary_service_through_sidecar_outbound_unchanged(tmp_path: Path) -> None:
    (app,) = await start_backends(1)
    inbound, outbound = free_port(), free_port()
    text = f"""
version: 1
services:
  inventory:
    endpoints: [127.0.0.1:{inbound}]
    hosts: [inventory.local]
sidecars:
  inventory-sidecar:
    service: inventory
    inbound: {{listen: 127.0.0.1:{inbound}, local: 127.0.0.1:{app.port}}}
  caller-sidecar:
    service: inventory
    outbound: {{listen: 127.0.0.1:{outbound}, upstreams: [inventory]}}
"""
    try:
        async with mesh(
            tmp_path, text, {"inventory-sidecar": inbound, "caller-sidecar": outbound}
        ) as m:
            status, _, body = await m.get(
                outbound, "/items/7?x=1", {"Host": "inventory.local", "X-Custom": "kept"}
            )
            assert status == 200 and body == f"{app.name} /items/7 0"
            assert app.seen_headers[-1]["x-custom"] == "kept"
            status, _, _ = await m.get(outbound, "/items/7", {"Host": "unknown.local"})
            assert status == 404
    finally:
        await app.aclose()
