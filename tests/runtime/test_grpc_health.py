"""runtime.grpc_health: grpcio-health-checking's aio servicer answers from a HealthState."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from runtime.grpc_health import AioHealth
from runtime.health import NOT_SERVING, SERVING, HealthState


class Aborted(Exception):
    pass


class FakeContext:
    code: Any = None

    async def abort(self, code: Any, details: str = "") -> None:
        self.code = code
        raise Aborted(code)


async def _check(health: AioHealth, service: str) -> int:
    req = health_pb2.HealthCheckRequest(service=service)
    resp = await health.servicer.Check(req, FakeContext())
    return int(resp.status)


async def test_serving_names_then_not_serving_after_shutdown() -> None:
    state = HealthState(["envoy.service.ext_proc.v3.ExternalProcessor"])
    health = AioHealth(state)
    await health.sync()
    assert await _check(health, "") == SERVING
    assert await _check(health, "envoy.service.ext_proc.v3.ExternalProcessor") == SERVING
    state.shutdown()
    await health.sync()
    assert await _check(health, "") == NOT_SERVING
    assert await _check(health, "envoy.service.ext_proc.v3.ExternalProcessor") == NOT_SERVING


async def test_unknown_service_is_not_found() -> None:
    health = AioHealth(HealthState())
    await health.sync()
    ctx = FakeContext()
    with pytest.raises(Aborted):
        await health.servicer.Check(health_pb2.HealthCheckRequest(service="nope"), ctx)
    assert ctx.code == grpc.StatusCode.NOT_FOUND
