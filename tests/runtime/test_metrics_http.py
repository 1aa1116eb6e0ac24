"""runtime.metrics_http: /healthz follows the process's HealthState; /metrics its registry."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from runtime.health import HealthState
from runtime.metrics_http import RENDER_SWITCH_INTERVAL, MetricsServer

REQUEST: Any = None  # the handlers read nothing from the request


async def test_healthz_is_ok_while_serving_and_503_while_draining() -> None:
    state = HealthState()
    server = MetricsServer(CollectorRegistry(), health=state)
    ok = await server._healthz(REQUEST)
    assert ok.status == 200 and ok.text == "ok\n"
    state.shutdown()
    draining = await server._healthz(REQUEST)
    assert draining.status == 503 and draining.text == "draining\n"


async def test_metrics_serves_the_registry() -> None:
    registry = CollectorRegistry()
    Counter("tw_test_things", "things", registry=registry).inc(3)
    resp = await MetricsServer(registry)._metrics(REQUEST)
    assert resp.body is not None and b"tw_test_things_total 3.0" in bytes(resp.body)


class _Probe:
    """A collector that notes the thread switch interval in force while it is collected."""

    def __init__(self) -> None:
        self.seen: list[float] = []

    def collect(self) -> list[Any]:
        self.seen.append(sys.getswitchinterval())
        return []


async def test_the_page_renders_with_a_short_switch_interval_and_restores_it() -> None:
    registry = CollectorRegistry()
    probe = _Probe()
    registry.register(probe)  # type: ignore[arg-type]
    before = sys.getswitchinterval()
    await MetricsServer(registry)._metrics(REQUEST)
    assert probe.seen == [pytest.approx(RENDER_SWITCH_INTERVAL)] and before > RENDER_SWITCH_INTERVAL
    assert sys.getswitchinterval() == before
    await MetricsServer(registry, render_switch_interval=None)._metrics(REQUEST)
    assert probe.seen[-1] == before  # left alone when told


async def test_a_failed_render_restores_the_switch_interval() -> None:
    class Broken:
        def collect(self) -> list[Any]:
            raise RuntimeError("collector failed")

    registry = CollectorRegistry()
    registry.register(Broken())  # type: ignore[arg-type]
    before = sys.getswitchinterval()
    with pytest.raises(RuntimeError, match="collector failed"):
        await MetricsServer(registry)._metrics(REQUEST)
    assert sys.getswitchinterval() == before
