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
from urllib.parse import quote

from controlplane.dashboard.collector import Source
from controlplane.dashboard.summary import Totals
from policy import Policy
from policy.servers import worker_metrics_ports
from policy.tenancy import QuotaLimits
from quota.reader import WindowUsage

__all__ = [
    "binding",
    "envoy_sources",
    "lane_rows",
    "recent_rejections",
    "sources_from_policy",
    "tenant_rows",
    "with_windows",
]

# the stats of Envoy's the dashboard reads: answers by code on each route's cluster
ENVOY_STATS = "/stats/prometheus?usedonly&filter=" + quote(
    r"^cluster\.[^.]+\.upstream_rq_([1-5]xx|[0-9]{3})$", safe=""
)

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


def envoy_sources(nodes: list[dict[str, Any]]) -> list[Source]:
    """The connected Envoys that said where their admin listens (``tokenweir up`` starts
    them so: tokenweir.envoy_launcher), for their stats."""
    return [Source(f"envoy {n['node']}", n["admin"], ENVOY_STATS) for n in nodes if n.get("admin")]


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
    """The rows with each read tenant's token windows, its budget (the longest token window)
    as Redis has it (live quota edits included), and the limit that binds now
    (:func:`binding`) over its token, request and money quotas."""
    out = []
    for row in rows:
        read = windows.get(row["tenant"])
        if read is not None:
            tokens = [w for w in read if w.quota == "tokens"]
            top = _longest(tokens)
            row = {**row, "windows": [w.to_json() for w in tokens],
                   "budget": top.to_json() if top is not None else None,
                   "binding": binding(read)}  # fmt: skip
        out.append(row)
    return out


def binding(read: list[WindowUsage]) -> dict[str, Any] | None:
    """The enforced limit closest to refusing: the highest share used (a bucket: the share of
    its capacity drawn down now), the shortest reset on a tie; None without an enforced one.
    ``usd`` limits are shown in dollars (Redis counts micro-USD)."""
    live = [w for w in read if not w.shadow and w.limit > 0]
    if not live:
        return None
    w = min(live, key=lambda w: (-w.used / w.limit, w.reset_s if w.reset_s is not None else 1e18))
    out = {"quota": w.quota, **w.to_json(), "use": round(min(1.0, w.used / w.limit), 4)}
    if w.quota == "usd":
        for k, micro in (("limit", w.limit), ("used", w.used), ("remaining", w.remaining)):
            out[k] = round(micro / 1e6, 6)
        if "refill_per_second" in out:
            out["refill_per_second"] = w.rate / 1e6
    return out


def recent_rejections(
    rows: list[dict[str, Any]], totals: Totals, then: tuple[float, Totals] | None, now: float
) -> list[dict[str, Any]]:
    """Each row's over-limit answers since ``then`` (``recent_429``, over ``recent_s``); None
    before the collector has a round to count from."""
    out = []
    for row in rows:
        name = row["tenant"]
        if then is None:
            recent, span = None, None
        else:
            recent = int(max(0.0, totals.retry_count.get(name, 0.0)
                             - then[1].retry_count.get(name, 0.0)))  # fmt: skip
            span = round(max(0.0, now - then[0]), 1)
        out.append({**row, "recent_429": recent, "recent_s": span})
    return out


def _rank(row: dict[str, Any]) -> tuple[int, int, str]:
    return (-int(row["since_start"]["tokens"]), -int(row["rejections"]), str(row["tenant"]))


def lane_rows(totals: Totals) -> list[dict[str, Any]]:
    """Admission's admitted / queued / shed per pool and lane, and the requests the pool's
    ladder shed (``shed_by_ladder``; ``shed`` counts both)."""
    keys = set(totals.admitted) | set(totals.shed) | set(totals.queued) | set(totals.ladder_shed)
    rows = []
    for key in sorted(keys):
        gate, ladder = int(totals.shed.get(key, 0)), int(totals.ladder_shed.get(key, 0))
        rows.append({
            "pool": key[0],
            "lane": key[1],
            "admitted": int(totals.admitted.get(key, 0)),
            "queued": int(totals.queued.get(key, 0)),
            "shed": gate + ladder,
            "shed_by_admission": gate,
            "shed_by_ladder": ladder,
        })  # fmt: skip
    return rows
