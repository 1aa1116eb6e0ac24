"""Where the servers of the mesh listen: control plane, rate-limit service, filter server.

``drain_timeout`` (each server): on SIGTERM or Ctrl-C, how long work in flight may run on
after the server reports NOT_SERVING and stops taking new work (``docs/operations.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from controlplane.policy.common import Address, Port
from controlplane.policy.decode import Duration, Range, Size
from controlplane.policy.saturation import PoolStateScrape

__all__ = ["ControlPlane", "FiltersServer", "RateLimitServer"]


@dataclass(frozen=True)
class RateLimitServer:
    address: Address = field(default_factory=lambda: Address("127.0.0.1", 18081))
    domain: str = "tokenweir"
    timeout: Annotated[float, Duration(0.001, 10)] = 0.05
    failure_mode_deny: bool = False
    redis_url: str | None = None
    redis_failure_mode: Literal["open", "closed"] = "open"
    reservation_ttl: Annotated[float, Duration(1, 86400)] = 600.0
    replicas: Annotated[int, Range(1, 16)] = 1
    metrics_port: Port | None = None
    drain_timeout: Annotated[float, Duration(0, 3600)] = 30.0


@dataclass(frozen=True)
class FiltersServer:
    address: Address = field(default_factory=lambda: Address("127.0.0.1", 18082))
    message_timeout: Annotated[float, Duration(0.001, 60)] = 0.2
    max_body_bytes: Annotated[int, Size(1024, 64 * 1024**2)] = 1024**2
    processes: Annotated[int, Range(1, 16)] = 1
    metrics_port: Port | None = None
    drain_timeout: Annotated[float, Duration(0, 3600)] = 30.0


@dataclass(frozen=True)
class ControlPlane:
    xds: Address = field(default_factory=lambda: Address("127.0.0.1", 18000))
    metrics: Address = field(default_factory=lambda: Address("127.0.0.1", 18001))
    debounce: Annotated[float, Duration(0, 10)] = 0.1
    delta: bool = True
    pool_state: PoolStateScrape = field(default_factory=PoolStateScrape)
    drain_timeout: Annotated[float, Duration(0, 3600)] = 30.0  # `up`: Envoys drain this long
