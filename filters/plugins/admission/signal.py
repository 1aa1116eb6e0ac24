"""Pool state for admission: the control plane's published saturation (poolstate),
read through :class:`~poolstate.reader.PoolStateReader`.

Only fresh data lowers admission: the policy's capacity is already a safe bound, so while the
reader is stale (the control plane is silent) admission falls back to it instead of treating
every pool as full (which would admit one request per pool during a control-plane restart).
Likewise a pool's declared priority scheduling is trusted until fresh data shows a replica
that schedules otherwise (:func:`ranking_source`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TypeVar

from filters.plugins.admission.gate import (
    CapacitySource,
    RankingSource,
    ReadySource,
    SaturationSource,
)
from filters.plugins.admission.spread import Down, replicas_down
from policy.model import Policy
from poolstate.reader import PoolStateReader, pools_url
from poolstate.state import PoolSummary, ReplicaState
from poolstate.valley import ladder_level
from runtime.admin_auth import admin_tls, admin_token

__all__ = [
    "admission_alive",
    "admission_saturation",
    "admission_source",
    "alive_source",
    "capacity_source",
    "down_source",
    "ladder_source",
    "pool_capacity",
    "pool_state_reader",
    "ranking_source",
    "ready_source",
    "saturation_source",
    "uses_admission",
]


def uses_admission(policy: Policy) -> bool:
    """Some enabled route runs the admission plugin."""
    return policy.admission.enabled and any(
        p.name == "admission"
        for g in policy.gateways.values()
        for r in g.routes
        if r.filters is not None and r.filters.enabled
        for p in r.filters.plugins
    )


def pool_state_reader(
    policy: Policy, clock: Callable[[], float], *, needed: bool = False
) -> PoolStateReader | None:
    """A (not yet started) reader of the control plane's pool state, when admission uses it
    (or ``needed``: another reader of it, the degradation ladder, runs)."""
    if not (needed or (uses_admission(policy) and policy.admission.pool_state)):
        return None
    cp = policy.control_plane
    tls = admin_tls(os.environ)  # the control plane serves HTTPS with the same settings
    return PoolStateReader(
        pools_url(cp.metrics.host, cp.metrics.port, https=tls is not None),
        ssl_context=tls.client() if tls is not None else None,
        clock=clock,
        stale_after_s=max(2.0, 2 * cp.pool_state.stale_after),
        token=admin_token(os.environ),  # the process's settings: runtime.admin_auth
    )


def admission_saturation(saturations: list[float]) -> float | None:
    """Pure: the saturation admission reads for a pool, accounted per replica. Each replica
    offers the share of its slots it can still take (1 up to saturation 1, ``2 − s`` past it,
    none from 2 on); the pool's figure is ``2 − mean(share)``, so ``saturated_limit`` lowers
    the limit to the sum of what the replicas offer. A queue on one replica lowers admission
    even while another idles (ring hash with bounded load keeps sending that replica its
    keys): the pool's mean saturation would hide it. None without replicas."""
    if not saturations:
        return None
    shares = [min(1.0, max(0.0, 2.0 - s)) for s in saturations]
    return 2.0 - sum(shares) / len(shares)


T = TypeVar("T")


def _per_pool(
    reader: PoolStateReader, figure: Callable[[PoolSummary], T | None]
) -> Callable[[str], T | None]:
    """pool → ``figure`` of its summary; None while the pool state is stale or lacks the pool."""

    def source(pool: str) -> T | None:
        if reader.stale:
            return None
        summary = reader.state.pools.get(pool)
        return None if summary is None else figure(summary)

    return source


def admission_source(reader: PoolStateReader) -> SaturationSource:
    """Per-replica saturation for admission (:func:`admission_saturation`); None while stale."""
    return _per_pool(
        reader, lambda s: admission_saturation([r.saturation for r in s.endpoints.values()])
    )


def admission_alive(replicas: list[tuple[bool, bool]]) -> float | None:
    """Pure: the share of a pool's replicas that answer (``(healthy, stale)`` per replica:
    the last scrape answered, and one did within ``stale_after``); None without replicas.
    The lanes that preempt lower ones count against the declared limit times this share: a
    busy replica still counts (its queue may be preempted batch), a dead one does not."""
    if not replicas:
        return None
    return sum(1 for healthy, stale in replicas if healthy and not stale) / len(replicas)


def alive_source(reader: PoolStateReader) -> SaturationSource:
    """Per pool, the share of its replicas that answer (:func:`admission_alive`); None while
    the pool state is stale."""
    return _per_pool(
        reader, lambda s: admission_alive([(r.healthy, r.stale) for r in s.endpoints.values()])
    )


def pool_capacity(summary: PoolSummary) -> int | None:
    """Pure: the running slots of a whole pool from what its fresh replicas report
    (``capacity_running``, their ``/get_server_info`` ``max_running_requests``): their mean
    times every replica of the pool. A replica that stops answering does not shrink it, since
    admission's saturation already counts that replica as offering nothing
    (:func:`admission_saturation`); counting it twice would halve the pool. None when no fresh
    replica reports."""
    fresh = len(summary.fresh)
    if not fresh or summary.capacity_running <= 0:
        return None
    return max(1, summary.capacity_running * len(summary.endpoints) // fresh)


def capacity_source(reader: PoolStateReader) -> CapacitySource:
    """Per pool, :func:`pool_capacity`; None while the pool state is stale."""
    return _per_pool(reader, pool_capacity)


def saturation_source(reader: PoolStateReader) -> SaturationSource:
    """Per pool, its mean saturation; None while the pool state is stale."""
    return ladder_source(reader, lambda pool: 0)


def ladder_source(reader: PoolStateReader, lines: Callable[[str], int]) -> SaturationSource:
    """Per pool, the saturation the degradation ladder reads: the pool's mean, less the share
    of its slots the batch runners' ``lines(pool)`` at its replicas hold
    (:func:`poolstate.valley.ladder_level`, over :func:`pool_capacity`: the slots of every
    replica, as the mean counts them); None while the pool state is stale."""
    pool_state = _per_pool(
        reader, lambda s: (s.saturation, pool_capacity(s) or 0) if s.endpoints else None
    )

    def source(pool: str) -> float | None:
        got = pool_state(pool)
        return None if got is None else ladder_level(got[0], lines(pool), got[1])

    return source


def ranking_source(reader: PoolStateReader) -> RankingSource:
    """Per pool, its replicas (each with the priority scheduling it reported) for the check that
    a pool declaring ``priority_scheduling`` ranks (:func:`poolstate.pool_mismatch`);
    None while the pool state is stale: the policy is trusted then."""

    def replicas(s: PoolSummary) -> Mapping[str, ReplicaState]:
        return s.endpoints

    return _per_pool(reader, replicas)


def down_source(reader: PoolStateReader) -> Down:
    """Per pool, its replicas the pool state marks unhealthy or stale (lane balance skips
    them); None while the pool state is stale (the policy's endpoints are all we know)."""
    return _per_pool(reader, lambda s: replicas_down(s.endpoints))


def ready_source(reader: PoolStateReader, wall: Callable[[], float]) -> ReadySource:
    """Per pool, seconds until a replica it is starting should serve
    (:meth:`~poolstate.state.PoolSummary.ready_in` at ``wall()``); None while the pool state is
    stale, none starts, or the one expected is overdue: then nothing is promised."""
    return _per_pool(reader, lambda s: s.ready_in(wall()))
