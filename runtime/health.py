"""``grpc.health.v1.Health`` state for one process: what its servers answer to health checks.

Every gRPC server of the mesh (control plane, rate-limit service, filter server; either
transport) answers ``/grpc.health.v1.Health/Check`` from one :class:`HealthState`. On shutdown
the process calls :meth:`HealthState.shutdown` first, so probes and load balancers see
``NOT_SERVING`` before in-flight work drains (``docs/operations.md``).

The overall status is the empty service name ``""``; servers also register their full gRPC
service names (``envoy.service.ratelimit.v3.RateLimitService`` …). An unknown name answers
``SERVICE_UNKNOWN`` (the gRPC health protocol says NOT_FOUND for Check; the h2 transport and
grpc.aio both map it so).
"""

from __future__ import annotations

from collections.abc import Iterable

from grpc_health.v1 import health_pb2

__all__ = [
    "CHECK_PATH",
    "NOT_SERVING",
    "SERVICE_UNKNOWN",
    "SERVING",
    "HealthState",
    "UnknownService",
]

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN

CHECK_PATH = "/grpc.health.v1.Health/Check"


class UnknownService(LookupError):
    """A Check for a service name this process does not serve (gRPC status NOT_FOUND)."""


class HealthState:
    """Serving status per service name; starts SERVING for ``""`` and every name given."""

    def __init__(self, services: Iterable[str] = ()) -> None:
        self._status: dict[str, int] = {"": SERVING}
        for name in services:
            self._status[name] = SERVING

    def add(self, service: str) -> None:
        self._status.setdefault(service, SERVING if self.serving else NOT_SERVING)

    @property
    def serving(self) -> bool:
        return self._status[""] == SERVING

    def status(self, service: str = "") -> int:
        try:
            return self._status[service]
        except KeyError:
            raise UnknownService(service) from None

    def statuses(self) -> dict[str, int]:
        """Every registered service name and its status (a copy)."""
        return dict(self._status)

    def shutdown(self) -> None:
        """Every service NOT_SERVING from now on (the first step of a drain)."""
        for name in self._status:
            self._status[name] = NOT_SERVING

    def resume(self) -> None:
        for name in self._status:
            self._status[name] = SERVING

    def check_bytes(self, request: bytes) -> bytes:
        """The h2 transport's handler: a serialized HealthCheckRequest in, the response out.

        Raises :class:`UnknownService` (→ NOT_FOUND) or ``DecodeError`` (→ INVALID_ARGUMENT).
        """
        req = health_pb2.HealthCheckRequest.FromString(request)
        return health_pb2.HealthCheckResponse(status=self.status(req.service)).SerializeToString()
