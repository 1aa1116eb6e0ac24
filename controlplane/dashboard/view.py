"""The rows the dashboard shows, from the policy, the collector's totals and the quota state
read from Redis (pure).

Tenants: the token budget of the longest window in the tenant's effective quota (live fields
over its own quota, else its tier's), with what that window has used as the quota counts it
(``controlplane.dashboard.quota``: a window's counter, a bucket's capacity minus its level),
every window of its token quota, the tokens the backends reported since the services started
(``since_start``: prompt + completion, cached among the prompt tokens), over-limit answers and
the Retry-After they carried. Lanes: admission's admitted / queued / shed per pool and lane.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controlplane.dashboard.collector import Source
from controlplane.dashboard.summary import Totals
from controlplane.policy import Policy
from controlplane.policy.servers import worker_metrics_ports
from controlplane.policy.tenancy import QuotaLimits
from runtime.quota.reader import WindowUsage

__all__ = ["lane_rows", "sources_from_policy", "tenant_rows", "with_windows"]

_WINDOWS = ("per_month", "per_day", "per_hour", "per_minute")


def sources_from_policy(policy: Policy) -> list[Source]:
    """Every worker process's metrics endpoint, of every replica (``policy.replicas``)."""
    out: list[Source] = []
    n = policy.replicas
    f, rl = policy.filters, policy.ratelimit
    if f is not None and f.metrics_port is not None:
        out += _sources("filters", f.metrics_port, n.filters, f.processes)
    if rl is not None and rl.metrics_port is not None:
        out += _sources("ratelimit", rl.metrics_port, n.ratelimit, rl.replicas)
    return out


def _sources(label: str, first: int, replicas: int, workers: int) -> list[Source]:
    def name(r: int, w: int) -> str:
        return f"{label}#{w}" if replicas == 1 else f"{label}#{r}.{w}"

    return [
        Source(name(r, w), f"127.0.0.1:{port}")
        for r, w, port in worker_metrics_ports(first, replicas, workers)
    ]


def _budget(q: QuotaLimits | None) -> dict[str, Any] | None:
    """The policy's budget of the longest window (``used`` unknown: Redis was not read)."""
    if q is None:
        return None
    for window in _WINDOWS:
        limit = getattr(q, window)
        if limit is not None:
            return {"window": window, "limit": limit, "used": None, "remaining": None}
    if q.burst is not None and q.refill_per_second is not None:
        return {"window": "bucket", "limit": q.burst, "used": None, "remaining": None,
                "refill_per_second": q.refill_per_second}  # fmt: skip
    return None


def _longest(windows: list[WindowUsage]) -> WindowUsage | None:
    order = {w: i for i, w in enumerate((*_WINDOWS, "bucket"))}
    return min(windows, key=lambda w: order[w.window], default=None)


def tenant_rows(policy: Policy, totals: Totals, limit: int = 100) -> list[dict[str, Any]]:
    """The ``limit`` tenants with the most tokens since start (then by name); every policy
    tenant counts. Budgets carry the policy's limit and ``used: null`` until
    :func:`with_windows` fills in what Redis says."""
    used: dict[str, dict[str, float]] = {}
    for (tenant, kind), v in totals.tokens.items():
        used.setdefault(tenant, {})[kind] = v
    names = set(policy.tenants) | set(used) | set(totals.retry_count)
    rows: list[dict[str, Any]] = []
    for name in names:
        t = policy.tenants.get(name)
        tier = policy.tiers.get(t.tier) if t is not None else None
        own = t.quotas.tokens if t is not None and t.quotas is not None else None
        u = used.get(name, {})
        count = totals.retry_count.get(name, 0.0)
        row: dict[str, Any] = {
            "tenant": name,
            "tier": t.tier if t is not None else None,
            "budget": _budget(own or (tier.quotas.tokens if tier is not None else None)),
            "windows": None,
            "since_start": {
                "prompt_tokens": int(u.get("prompt", 0)),
                "completion_tokens": int(u.get("completion", 0)),
                "cached_tokens": int(u.get("cached", 0)),
                "tokens": int(u.get("prompt", 0) + u.get("completion", 0)),
            },
            "rejections": int(count),
            "retry_after_mean_s": round(totals.retry_sum.get(name, 0.0) / count, 3)
            if count
            else None,
        }
        rows.append(row)
    rows.sort(key=_rank)
    return rows[:limit]


def with_windows(
    rows: list[dict[str, Any]], windows: Mapping[str, list[WindowUsage]]
) -> list[dict[str, Any]]:
    """The rows with each read tenant's windows, and its budget (the longest window) as Redis
    has it: live quota edits included."""
    out = []
    for row in rows:
        read = windows.get(row["tenant"])
        if read is not None:
            top = _longest(read)
            row = {**row, "windows": [w.to_json() for w in read],
                   "budget": top.to_json() if top is not None else None}  # fmt: skip
        out.append(row)
    return out


def _rank(row: dict[str, Any]) -> tuple[int, int, str]:
    return (-int(row["since_start"]["tokens"]), -int(row["rejections"]), str(row["tenant"]))


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
