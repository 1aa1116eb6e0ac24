"""What one filter process may admit to a pool: the policy's capacity, split by rule, and
lowered while the pool state says the pool is saturated. Pure."""

from __future__ import annotations

import math
from typing import Any

from filters.plugins.admission.core import LaneConfig

__all__ = [
    "gateway_processes",
    "lane_configs",
    "pool_limits",
    "preemptive",
    "process_share",
    "process_split",
    "saturated_limit",
]


def _replicas(pool: Any) -> int:
    if pool.endpoints:
        return len(pool.endpoints)
    if pool.emulated is not None:
        return int(pool.emulated.replicas)
    return 1


def process_split(policy: Any, local: int | None = None) -> int:
    """The split rule: each of ``admission.gateways`` gateways runs ``local`` filter processes
    (its filter servers, over which its Envoys spread the ext_proc streams, times each one's
    processes; default the policy's ``replicas.filters × filters.processes``), and each process
    admits an equal share of a pool's capacity."""
    if local is None:
        local = gateway_processes(policy)
    return int(policy.admission.gateways * max(1, local))


def gateway_processes(policy: Any, servers: int | None = None, processes: int | None = None) -> int:
    """One gateway's filter processes: ``servers`` filter servers (default the policy's
    ``replicas.filters``) of ``processes`` processes each (default ``filters.processes``)."""
    if servers is None:
        replicas = getattr(policy, "replicas", None)
        servers = replicas.filters if replicas is not None else 1
    if processes is None:
        processes = policy.filters.processes if policy.filters is not None else 1
    return servers * processes


def process_share(pool_total: int, split: int) -> int:
    """One filter process's share of what a whole pool runs at once (at least 1)."""
    return max(1, pool_total // max(1, split))


def pool_limits(
    policy: Any, pool_name: str, local: int | None = None
) -> tuple[int | None, int | None]:
    """(in-flight requests, in-flight tokens) for one filter process, or None where the policy
    declares no capacity (:func:`process_split`)."""
    pool = policy.pools[pool_name]
    cap = pool.capacity
    split = process_split(policy, local)
    replicas = _replicas(pool)

    def share(per_replica: int | None) -> int | None:
        if per_replica is None:
            return None
        return process_share(per_replica * replicas, split)

    return share(cap.max_running_requests), share(cap.max_total_tokens)


def preemptive(policy: Any, pool_name: str) -> bool:
    """Whether the pool's backends schedule by request priority and preempt running
    lower-priority requests (``pools.NAME.priority_scheduling``): the gateway writes each lane's
    priority into the body, and the lanes above the lowest are admitted past the slots the
    lower lanes hold (:class:`~filters.plugins.admission.core.Admission`, ``preemptive``)."""
    return bool(policy.pools[pool_name].priority_scheduling.enabled)


def saturated_limit(limit: int | None, saturation: float | None) -> int | None:
    """Fewer admitted requests while the pool is past saturation 1 (its own queues are
    filling): ``limit × (2 − saturation)``, at least 1; unchanged below 1 or without data."""
    if limit is None or saturation is None or saturation <= 1.0:
        return limit
    factor = max(0.0, 2.0 - min(saturation, 2.0))
    return max(1, math.floor(limit * factor))


def lane_configs(policy: Any) -> list[LaneConfig]:
    """Both lanes, highest priority first."""
    out = []
    for name in ("interactive", "batch"):
        lane = policy.admission.lane(name)
        out.append(
            LaneConfig(
                name,
                lane.max_queue,
                lane.tenant_queue,
                lane.wait,
                lane.max_share,
                lane.leave_for_higher,
            )
        )
    return out
