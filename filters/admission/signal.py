"""Pool state for admission: the control plane's published saturation (runtime.poolstate),
read through :class:`~runtime.poolstate.reader.PoolStateReader`.

Only fresh data lowers admission: the policy's capacity is already a safe bound, so while the
reader is stale (the control plane is silent) admission falls back to it instead of treating
every pool as full (which would admit one request per pool during a control-plane restart).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from filters.admission.gate import SaturationSource
from runtime.poolstate.reader import PoolStateReader, pools_url

__all__ = ["pool_state_reader", "saturation_source", "uses_admission"]


def uses_admission(policy: Any) -> bool:
    """Some enabled route runs the admission plugin."""
    return policy.admission.enabled and any(
        p.name == "admission"
        for g in policy.gateways.values()
        for r in g.routes
        if r.filters is not None and r.filters.enabled
        for p in r.filters.plugins
    )


def pool_state_reader(
    policy: Any, clock: Callable[[], float], *, needed: bool = False
) -> PoolStateReader | None:
    """A (not yet started) reader of the control plane's pool state, when admission uses it
    (or ``needed``: another reader of it, the degradation ladder, runs)."""
    if not (needed or (uses_admission(policy) and policy.admission.pool_state)):
        return None
    cp = policy.control_plane
    return PoolStateReader(
        pools_url(cp.metrics.host, cp.metrics.port),
        clock=clock,
        stale_after_s=max(2.0, 2 * cp.pool_state.stale_after),
    )


def saturation_source(reader: PoolStateReader) -> SaturationSource:
    def saturation(pool: str) -> float | None:
        if reader.stale:
            return None
        summary = reader.state.pools.get(pool)
        return summary.saturation if summary is not None and summary.endpoints else None

    return saturation
