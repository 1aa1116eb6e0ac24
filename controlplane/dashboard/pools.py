"""Per pool, what governs it now and what it answered (pure): the ladder's step, admission's
capacity, in flight and queued, and the answers by status.

Where each number comes from (docs/api.md):

* ``ladder_step``: ``tokenweir_filters_ladder_step{pool}``, the highest over the filter
  processes (each steps on its own reading);
* ``admission_capacity``, ``in_flight``, ``queued``: ``tokenweir_admission_limit{pool}``,
  ``_in_flight{pool}``, ``_queued{pool,lane}`` summed over the filter processes (each admits its
  share of the pool);
* ``answers``: counts since the processes started. The gateway answers some requests itself
  before they reach the pool. The filter server's refusals (admission and ladder sheds, bad or
  too-large bodies, unknown keys) are ``tokenweir_filters_rejections_total{route,status}`` of
  the pool's routes; Envoy does not count them per cluster. Everything else Envoy counts on the
  route's cluster (``cluster.<c>.upstream_rq_<code>`` and ``_<class>xx``, summed over every
  gateway, for the pool's cluster, its canary and its fallback aggregate): the replicas' answers
  and the rate-limit filter's 429s, which Envoy charges to the route's cluster. ``429``,
  ``503``: those codes; ``4xx``, ``5xx``: the other codes of that class; ``requests``: all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

from controlplane.dashboard.summary import Totals
from controlplane.translate.names import canary_cluster, fallback_cluster, pool_cluster
from policy import Policy

__all__ = ["CODES", "PoolRow", "answers", "pool_rows", "route_pools"]

CODES = ("2xx", "429", "4xx", "503", "5xx")


class PoolRow(TypedDict):
    """One pool of the overview's ``pool_status`` (docs/api.md)."""

    pool: str
    ladder_step: int | None
    ladder_steps: int
    admission_capacity: float | None
    in_flight: float | None
    queued: int
    answers: dict[str, int]  # by CODES and ``requests``, since start
    per_s: dict[str, float] | None


def route_pools(policy: Policy) -> dict[str, str]:
    """Route name → the pool it serves, over every gateway."""
    return {r.name: r.pool for g in policy.gateways.values() for r in g.routes if r.pool}


def _clusters(pool: str) -> tuple[str, ...]:
    return (pool_cluster(pool), canary_cluster(pool), fallback_cluster(pool))


def answers(totals: Totals, pool: str, routes: Mapping[str, str]) -> dict[str, float]:
    """The pool's answers by :data:`CODES` and in all (``requests``), counted since start."""
    out = dict.fromkeys((*CODES, "other"), 0.0)
    for cluster in _clusters(pool):
        up = {code: v for (c, code), v in totals.upstream.items() if c == cluster}
        out["2xx"] += up.get("2xx", 0.0)
        out["429"] += up.get("429", 0.0)
        out["4xx"] += max(0.0, up.get("4xx", 0.0) - up.get("429", 0.0))
        out["503"] += up.get("503", 0.0)
        out["5xx"] += max(0.0, up.get("5xx", 0.0) - up.get("503", 0.0))
        out["other"] += up.get("1xx", 0.0) + up.get("3xx", 0.0)
    for (route, status), v in totals.refused.items():
        if routes.get(route) == pool:
            key = status if status in ("429", "503") else f"{status[:1]}xx"
            out[key if key in CODES else "other"] += v
    out["requests"] = sum(out.values())
    del out["other"]
    return out


def pool_rows(
    policy: Policy | None,
    totals: Totals,
    then: tuple[float, Totals] | None,
    now: float,
) -> list[PoolRow]:
    """One row per policy pool; ``per_s``: the answers' rates since ``then`` (None without)."""
    if policy is None:
        return []
    routes = route_pools(policy)
    rows: list[PoolRow] = []
    for name, pool in sorted(policy.pools.items()):
        count = answers(totals, name, routes)
        per_s: dict[str, float] | None = None
        if then is not None and now > then[0]:
            old = answers(then[1], name, routes)
            dt = now - then[0]
            per_s = {k: round(max(0.0, v - old[k]) / dt, 3) for k, v in count.items()}
        queued = sum(v for (p, _), v in totals.queued.items() if p == name)
        rows.append({
            "pool": name,
            "ladder_step": int(totals.ladder_step[name]) if name in totals.ladder_step else None,
            "ladder_steps": len(pool.degradation.steps) if pool.degradation is not None else 0,
            "admission_capacity": totals.limit.get(name),
            "in_flight": totals.in_flight.get(name),
            "queued": int(queued),
            "answers": {k: int(v) for k, v in count.items()},
            "per_s": per_s,
        })  # fmt: skip
    return rows
