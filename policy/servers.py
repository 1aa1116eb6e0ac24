"""Where the servers of the mesh listen: control plane, rate-limit service, filter server.

``replicas`` says how many of each server run side by side (docs/deploy.md). On one machine
(``tokenweir up``) the gateways of a node group share their listen port (the listener sets
``enable_reuse_port``: the kernel spreads connections over the Envoys), while filter servers,
rate-limit services and control planes listen on consecutive ports: replica ``i`` on the
configured port ``+ i`` (its /metrics on ``metrics_port + i * processes``), so each is an
endpoint of its own in Envoy's cluster, health-checked and ejected on its own.

``drain_timeout`` (each server): on SIGTERM or Ctrl-C, how long work in flight may run on
after the server reports NOT_SERVING and stops taking new work (``docs/operations.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from policy.common import Address, Port
from policy.decode import Duration, Range, Size
from policy.saturation import PoolStateScrape
from policy.service_tls import ServiceTls
from wire.contract import RATELIMIT_DOMAIN

__all__ = [
    "ROLES",
    "ControlPlane",
    "FiltersServer",
    "RateLimitServer",
    "Replicas",
    "replica_addresses",
    "worker_metrics_ports",
]


@dataclass(frozen=True)
class RateLimitServer:
    address: Address = field(default_factory=lambda: Address("127.0.0.1", 18081))
    domain: str = RATELIMIT_DOMAIN
    timeout: Annotated[float, Duration(0.001, 10)] = 0.05
    failure_mode_deny: bool = False
    redis_url: str | None = None
    redis_failure_mode: Literal["open", "closed"] = "open"
    reservation_ttl: Annotated[float, Duration(1, 86400)] = 600.0
    replicas: Annotated[int, Range(1, 16)] = 1
    metrics_port: Port | None = None
    drain_timeout: Annotated[float, Duration(0, 3600)] = 30.0
    tls: ServiceTls | None = None  # mTLS with Envoy (policy.service_tls)
    allow_plaintext: bool = False  # serve beyond loopback without tls


@dataclass(frozen=True)
class FiltersServer:
    address: Address = field(default_factory=lambda: Address("127.0.0.1", 18082))
    message_timeout: Annotated[float, Duration(0.001, 60)] = 0.2
    max_body_bytes: Annotated[int, Size(1024, 64 * 1024**2)] = 1024**2
    processes: Annotated[int, Range(1, 16)] = 1
    metrics_port: Port | None = None
    drain_timeout: Annotated[float, Duration(0, 3600)] = 30.0
    tls: ServiceTls | None = None  # mTLS with Envoy (policy.service_tls)
    allow_plaintext: bool = False  # serve beyond loopback without tls


@dataclass(frozen=True)
class ControlPlane:
    xds: Address = field(default_factory=lambda: Address("127.0.0.1", 18000))
    metrics: Address = field(default_factory=lambda: Address("127.0.0.1", 18001))
    debounce: Annotated[float, Duration(0, 10)] = 0.1
    delta: bool = True
    pool_state: PoolStateScrape = field(default_factory=PoolStateScrape)
    drain_timeout: Annotated[float, Duration(0, 3600)] = 30.0  # `up`: Envoys drain this long


ROLES = ("gateway", "filters", "ratelimit", "controlplane")


@dataclass(frozen=True)
class Replicas:
    """How many of each server run side by side (``tokenweir up --replicas`` overrides it)."""

    gateway: Annotated[int, Range(1, 16)] = 1
    filters: Annotated[int, Range(1, 16)] = 1
    ratelimit: Annotated[int, Range(1, 16)] = 1
    controlplane: Annotated[int, Range(1, 16)] = 1

    @classmethod
    def parse(cls, text: str, base: Replicas | None = None) -> Replicas:
        """``gateway=3,filters=2,...`` (roles not named keep ``base``'s count)."""
        counts = {role: getattr(base or cls(), role) for role in ROLES}
        for item in filter(None, (part.strip() for part in text.split(","))):
            role, sep, value = item.partition("=")
            role = role.strip()
            if not sep or role not in counts:
                raise ValueError(f"expected ROLE=N with ROLE one of {list(ROLES)}, got {item!r}")
            if not value.strip().isdigit() or not 1 <= int(value) <= 16:
                raise ValueError(f"{role}: expected a count in 1..16, got {value.strip()!r}")
            counts[role] = int(value)
        return cls(**counts)

    def __str__(self) -> str:
        return ",".join(f"{role}={getattr(self, role)}" for role in ROLES)


def replica_addresses(first: Address, count: int) -> tuple[Address, ...]:
    """Where ``count`` replicas of a server listen: ``first``, then the next ports."""
    return tuple(Address(first.host, first.port + i) for i in range(count))


def worker_metrics_ports(first: int, replicas: int, workers: int) -> list[tuple[int, int, int]]:
    """``(replica, worker, port)`` of every /metrics page of ``replicas`` servers of ``workers``
    processes each: replica ``r``'s worker ``w`` on ``first + r * workers + w``."""
    return [(r, w, first + r * workers + w) for r in range(replicas) for w in range(workers)]
