import pytest
from grpc_health.v1 import health_pb2

from runtime.health import NOT_SERVING, SERVING, HealthState, UnknownService


def _check(state: HealthState, service: str) -> int:
    req = health_pb2.HealthCheckRequest(service=service).SerializeToString()
    return health_pb2.HealthCheckResponse.FromString(state.check_bytes(req)).status


def test_serving_until_shutdown_then_not_serving_for_every_name() -> None:
    state = HealthState(["envoy.service.ratelimit.v3.RateLimitService"])
    assert _check(state, "") == SERVING
    assert _check(state, "envoy.service.ratelimit.v3.RateLimitService") == SERVING
    state.shutdown()
    assert _check(state, "") == NOT_SERVING
    assert _check(state, "envoy.service.ratelimit.v3.RateLimitService") == NOT_SERVING
    state.add("late.Service")
    assert state.status("late.Service") == NOT_SERVING


def test_unknown_service_is_reported() -> None:
    with pytest.raises(UnknownService):
        _check(HealthState(), "no.such.Service")
