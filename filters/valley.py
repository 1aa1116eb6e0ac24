"""Which pools' batch-runner lines the filter server's degradation ladders leave out
(poolstate/valley.py says why; poolstate/valley_reader.py reads them)."""

from __future__ import annotations

from policy.model import Policy

__all__ = ["valley_pools"]


def valley_pools(policy: Policy) -> tuple[str, ...]:
    """The batch runners' pool, where it has a ladder and runners run."""
    b = policy.batch
    if b is None or b.runner.replicas <= 0:
        return ()
    pool = policy.pools.get(b.pool)
    return (b.pool,) if pool is not None and pool.degradation is not None else ()
