"""The rate-limit service's built-in gRPC transport: ``ShouldRateLimit`` on the shared HTTP/2
layer (:mod:`runtime.h2`), without grpc.aio.

Why: on small VMs grpc.aio spends ~0.2–0.3 ms of CPU per call in thread hand-offs and syscalls,
more than the decision itself. Envoy multiplexes many calls on one HTTP/2 connection; this
server reads them with one syscall, answers each from the event loop and writes all answers
ready in the same loop iteration with one syscall. It also answers ``grpc.health.v1.Health``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from runtime.h2 import GrpcH2Server, Limits, Method
from runtime.health import HealthState

__all__ = ["SHOULD_RATE_LIMIT_PATH", "H2Server"]

SHOULD_RATE_LIMIT_PATH = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"


class H2Server(GrpcH2Server):
    """``await start(host, port)`` … ``await aclose(grace)``; ``handler(request) -> reply``."""

    def __init__(
        self,
        handler: Callable[[bytes], Awaitable[bytes]],
        *,
        health: HealthState | None = None,
        limits: Limits | None = None,
        traced: Callable[[bytes, tuple[tuple[str, str], ...]], Awaitable[bytes]] | None = None,
    ) -> None:
        """``traced``: used instead of ``handler`` when given (it also gets the metadata)."""
        method = Method(unary=handler, unary_metadata=traced)
        super().__init__({SHOULD_RATE_LIMIT_PATH: method}, health=health, limits=limits)
