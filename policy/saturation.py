"""Policy of the saturation signal: what a pool can hold, how often it is scraped, and when
EDS sends new sessions past a saturated replica (docs/policy.md, docs/operations.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from policy.common import Positive
from policy.decode import Duration, Range

__all__ = ["PoolCapacity", "PoolStateScrape", "SaturationPolicy"]


@dataclass(frozen=True)
class PoolCapacity:
    """What one replica of the pool can hold; ``None`` = what its ``/get_server_info`` reports."""

    max_running_requests: Positive | None = None
    max_queued_requests: Positive | None = None
    max_total_tokens: Positive | None = None


@dataclass(frozen=True)
class SaturationPolicy:
    """When a replica counts as saturated for EDS, with hysteresis.

    A replica is marked at ``degrade_at`` and unmarked only once it is back at or below
    ``recover_at``. A marked replica is sent to Envoy as ``DEGRADED`` (``degraded_weight: 0``,
    the default: it leaves the hash ring, new sessions spill past it) or keeps
    ``degraded_weight`` percent of its ring weight (docs/operations.md has the measurements).
    """

    enabled: bool = True
    degrade_at: Annotated[float, Range(0.05, 2.0)] = 1.0
    recover_at: Annotated[float, Range(0.0, 2.0)] = 0.8
    degraded_weight: Annotated[int, Range(0, 100)] = 0

    def __post_init__(self) -> None:
        if self.recover_at >= self.degrade_at:
            raise ValueError("recover_at must be below degrade_at (hysteresis)")


@dataclass(frozen=True)
class PoolStateScrape:
    """How the control plane scrapes every pool replica's ``/metrics``."""

    interval: Annotated[float, Duration(0.01, 60)] = 0.25
    timeout: Annotated[float, Duration(0.01, 60)] = 0.2
    stale_after: Annotated[float, Duration(0.05, 600)] = 1.0

    def __post_init__(self) -> None:
        if self.stale_after <= self.interval:
            raise ValueError("stale_after must be longer than interval")
