"""The rows the dashboard shows, from the policy and the collector's totals (pure).

Tenants: tokens reported by the backends since the services started (prompt + completion,
cached among the prompt tokens), against the token budget of the longest window in the
tenant's effective quotas (the tenant's own quota, else its tier's); over-limit answers and the
Retry-After they carried. Lanes: admission's admitted / queued / shed per pool and lane.
"""

from __future__ import annotations

from typing import Any

from controlplane.dashboard.collector import Source
from controlplane.dashboard.summary import Totals
from controlplane.policy import Policy
from controlplane.policy.tenancy import QuotaLimits

__all__ = ["lane_rows", "sources_from_policy", "tenant_rows"]

_WINDOWS = ("per_month", "per_day", "per_hour", "per_minute")


def sources_from_policy(policy: Policy) -> list[Source]:
    """Every worker process's metrics endpoint (worker i listens on metrics_port + i)."""
    out: list[Source] = []
    f = policy.filters
    if f is not None and f.metrics_port is not None:
        out += [
            Source(f"filters#{i}", f"127.0.0.1:{f.metrics_port + i}") for i in range(f.processes)
        ]
    rl = policy.ratelimit
    if rl is not None and rl.metrics_port is not None:
        out += [
            Source(f"ratelimit#{i}", f"127.0.0.1:{rl.metrics_port + i}") for i in range(rl.replicas)
        ]
    return out


def _budget(q: QuotaLimits | None) -> dict[str, Any] | None:
    if q is None:
        return None
    for window in _WINDOWS:
        limit = getattr(q, window)
        if limit is not None:
            return {"window": window, "tokens": limit}
    if q.burst is not None:
        return {"window": "bucket", "tokens": q.burst, "refill_per_second": q.refill_per_second}
    return None


def tenant_rows(policy: Policy, totals: Totals, limit: int = 100) -> list[dict[str, Any]]:
    """The ``limit`` tenants with the most tokens (then by name); every policy tenant counts."""
    used: dict[str, dict[str, float]] = {}
    for (tenant, kind), v in totals.tokens.items():
        used.setdefault(tenant, {})[kind] = v
    names = set(policy.tenants) | set(used) | set(totals.retry_count)
    rows: list[dict[str, Any]] = []
    for name in names:
        t = policy.tenants.get(name)
        tier = policy.tiers.get(t.tier) if t is not None else None
        own = t.quotas.tokens if t is not None and t.quotas is not None else None
        budget = _budget(own or (tier.quotas.tokens if tier is not None else None))
        u = used.get(name, {})
        count = totals.retry_count.get(name, 0.0)
        rows.append(
            {
                "tenant": name,
                "tier": t.tier if t is not None else None,
                "prompt_tokens": int(u.get("prompt", 0)),
                "completion_tokens": int(u.get("completion", 0)),
                "cached_tokens": int(u.get("cached", 0)),
                "tokens": int(u.get("prompt", 0) + u.get("completion", 0)),
                "budget": budget,
                "rejections": int(count),
                "retry_after_mean_s": round(totals.retry_sum.get(name, 0.0) / count, 3)
                if count
                else None,
            }
        )
    rows.sort(key=lambda r: (-int(r["tokens"]), -int(r["rejections"]), str(r["tenant"])))
    return rows[:limit]


def lane_rows(totals: Totals) -> list[dict[str, Any]]:
    keys = set(totals.admitted) | set(totals.shed) | set(totals.queued)
    return [
        {
            "pool": pool,
            "lane": lane,
            "admitted": int(totals.admitted.get((pool, lane), 0)),
            "queued": int(totals.queued.get((pool, lane), 0)),
            "shed": int(totals.shed.get((pool, lane), 0)),
        }
        for pool, lane in sorted(keys)
    ]
