"""runtime.metrics_http: /healthz follows the process's HealthState; /metrics its registry."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter

from runtime.health import HealthState
from runtime.metrics_http import MetricsServer

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
