"""Pure: what the scraper reads, derived from the policy (pools, capacity, hysteresis, timing)."""

from __future__ import annotations

from dataclasses import dataclass, field

from policy import Policy
from policy.scheduling import PriorityScheduling
from poolstate import Capacity, Hysteresis

__all__ = ["PoolTargets", "ScrapeSettings", "targets_from_policy"]


@dataclass(frozen=True, slots=True)
class ScrapeSettings:
    interval_s: float = 0.25
    timeout_s: float = 0.2
    stale_after_s: float = 1.0


@dataclass(frozen=True, slots=True)
class PoolTargets:
    """One pool's replicas (``host:port``), declared capacity, and EDS hysteresis (None: off)."""

    endpoints: tuple[str, ...]
    capacity: Capacity = field(default_factory=Capacity)
    hysteresis: Hysteresis | None = field(default_factory=Hysteresis)
    degraded_weight: int = 0  # percent of the ring weight a marked replica keeps; 0: DEGRADED
    # the replicas must schedule by priority like this (None: the pool does not declare it)
    priority: PriorityScheduling | None = None


def targets_from_policy(policy: Policy) -> tuple[ScrapeSettings, dict[str, PoolTargets]]:
    ps = policy.control_plane.pool_state
    settings = ScrapeSettings(ps.interval, ps.timeout, ps.stale_after)
    pools = {}
    for name, pool in policy.pools.items():
        cap, sat = pool.capacity, pool.saturation
        pools[name] = PoolTargets(
            endpoints=tuple(str(ep) for ep in pool.endpoints),
            capacity=Capacity(
                cap.max_running_requests, cap.max_queued_requests, cap.max_total_tokens
            ),
            hysteresis=Hysteresis(sat.degrade_at, sat.recover_at) if sat.enabled else None,
            degraded_weight=sat.degraded_weight,
            priority=pool.priority_scheduling if pool.priority_scheduling.enabled else None,
        )
    return settings, pools
