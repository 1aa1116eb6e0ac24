"""The pool state: an immutable, versioned value the control plane publishes (one channel).

``PoolState`` holds, per pool, every replica's load as last scraped and the pool aggregate.
Saturation is a number: below 1 the replica has room (the larger of its running-slot and KV
fractions), from 1 to 2 requests wait in its queue (1 + queue fraction), 2 means its queue is
full. A replica whose data is missing or older than the pool's ``stale_after`` is reported with
``stale: true`` and saturation :data:`SATURATED` (readers treat it as full, never as idle).

JSON (``to_json`` / ``from_json``; the control plane's ``GET /api/v1/pools``)::

    {"version": 7, "ts": 1764554000.25,
     "pools": {"chat": {"saturation": 0.41, "replicas": 3, "healthy": 3,
                        "running": 40, "queued": 0, "capacity_running": 96, ...,
                        "endpoints": {"127.0.0.1:30001": {"s": 0.41, "run": 14, "q": 0,
                                       "kv": 0.22, "tput": 812.5, "hit": 0.37, "ok": true,
                                       "stale": false, "deg": false, "age": 0.12,
                                       "rank": {"on": true, "thr": 10, "low": false}}, ...}}}}

A pool with replicas starting (a scale-up under way: ``tokenweir up --autoscale`` reports them
to the control plane) also carries ``"starting": 2, "ready_at": 1764554120.0``: how many, and
the wall-clock time the first of them is expected to serve (:meth:`PoolSummary.ready_in`).
Both are left out when none starts; a state without them decodes as "none starting".

``rank`` (:class:`~poolstate.ranking.Ranking`) holds the priority-scheduling server
arguments the replica reported, each key only when known, and is left out when none is: a
state from an older control plane (without it) decodes as "unknown".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from poolstate.errors import PoolStateDecodeError
from poolstate.ranking import Ranking
from wire.jsontypes import JsonObject

__all__ = ["SATURATED", "PoolState", "PoolSummary", "ReplicaState"]

SATURATED = 2.0  # a full queue; stale or missing data reads as this


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """One replica's load at its last scrape."""

    saturation: float
    running: int = 0
    queued: int = 0
    token_usage: float = 0.0
    gen_throughput: float = 0.0
    cache_hit_rate: float = 0.0
    healthy: bool = True  # the last scrape answered
    stale: bool = False  # no good scrape within stale_after
    degraded: bool = False  # marked saturated (with hysteresis) for EDS
    age_s: float = 0.0  # seconds since the scrape this reflects
    ranking: Ranking = field(
        default_factory=Ranking
    )  # its priority scheduling, from /get_server_info

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "s": _round(self.saturation),
            "run": self.running,
            "q": self.queued,
            "kv": _round(self.token_usage),
            "tput": _round(self.gen_throughput),
            "hit": _round(self.cache_hit_rate),
            "ok": self.healthy,
            "stale": self.stale,
            "deg": self.degraded,
            "age": _round(self.age_s),
        }
        if self.ranking.known:
            out["rank"] = self.ranking.to_json()
        return out

    @classmethod
    def from_json(cls, d: object) -> ReplicaState:
        m = _mapping(d, "replica")
        return cls(
            saturation=_num(m, "s"),
            running=int(_num(m, "run")),
            queued=int(_num(m, "q")),
            token_usage=_num(m, "kv"),
            gen_throughput=_num(m, "tput"),
            cache_hit_rate=_num(m, "hit"),
            healthy=_bool(m, "ok"),
            stale=_bool(m, "stale"),
            degraded=_bool(m, "deg"),
            age_s=_num(m, "age"),
            ranking=Ranking.from_json(m["rank"]) if "rank" in m else Ranking(),
        )


@dataclass(frozen=True, slots=True)
class PoolSummary:
    """One pool: its replicas by ``host:port`` and their aggregate."""

    endpoints: Mapping[str, ReplicaState] = field(default_factory=dict)
    capacity_running: int = 0  # sum of max_running_requests over fresh replicas
    capacity_queued: int = 0  # sum of max_queued_requests over fresh replicas
    starting: int = 0  # replicas started and loading, not serving yet (not in ``endpoints``)
    ready_at: float | None = None  # wall clock (Unix s) the first of them should serve

    def __post_init__(self) -> None:
        object.__setattr__(self, "endpoints", MappingProxyType(dict(self.endpoints)))

    def ready_in(self, now: float) -> float | None:
        """Seconds from wall-clock ``now`` until a starting replica should serve; None when
        none starts, its time is unknown, or it is overdue (then nothing is promised)."""
        if self.starting <= 0 or self.ready_at is None or self.ready_at <= now:
            return None
        return self.ready_at - now

    @property
    def fresh(self) -> list[ReplicaState]:
        return [r for r in self.endpoints.values() if not r.stale]

    @property
    def running(self) -> int:
        return sum(r.running for r in self.fresh)

    @property
    def queued(self) -> int:
        return sum(r.queued for r in self.fresh)

    @property
    def saturation(self) -> float:
        """Mean replica saturation (stale replicas count as :data:`SATURATED`); none → SATURATED."""
        return _mean([r.saturation for r in self.endpoints.values()])

    @property
    def free_running(self) -> int:
        """Running slots still free on fresh replicas (what an admission queue may release)."""
        return max(self.capacity_running - self.running, 0)

    def to_json(self) -> JsonObject:
        fresh = self.fresh
        out: JsonObject = {
            # aggregates of the rounded replica values: a decoded state encodes identically
            "saturation": _round(_mean([_round(r.saturation) for r in self.endpoints.values()])),
            "replicas": len(self.endpoints),
            "healthy": len(fresh),
            "running": self.running,
            "queued": self.queued,
            "capacity_running": self.capacity_running,
            "capacity_queued": self.capacity_queued,
            "gen_throughput": _round(sum(_round(r.gen_throughput) for r in fresh)),
            "endpoints": {ep: r.to_json() for ep, r in sorted(self.endpoints.items())},
        }
        if self.starting > 0:
            out["starting"] = self.starting
            if self.ready_at is not None:
                out["ready_at"] = round(self.ready_at, 3)
        return out

    @classmethod
    def from_json(cls, d: object) -> PoolSummary:
        m = _mapping(d, "pool")
        eps = _mapping(m.get("endpoints"), "endpoints")
        return cls(
            endpoints={str(k): ReplicaState.from_json(v) for k, v in eps.items()},
            capacity_running=int(_num(m, "capacity_running")),
            capacity_queued=int(_num(m, "capacity_queued")),
            starting=int(_num(m, "starting")) if "starting" in m else 0,
            ready_at=_num(m, "ready_at") if "ready_at" in m else None,
        )


@dataclass(frozen=True, slots=True)
class PoolState:
    """Every pool at one moment; ``version`` grows by one with each published state."""

    version: int = 0
    ts: float = 0.0  # wall-clock time of the scrape round (Unix seconds)
    pools: Mapping[str, PoolSummary] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pools", MappingProxyType(dict(self.pools)))

    def to_json(self) -> JsonObject:
        return {
            "version": self.version,
            "ts": round(self.ts, 3),
            "pools": {name: p.to_json() for name, p in sorted(self.pools.items())},
        }

    @classmethod
    def from_json(cls, d: object) -> PoolState:
        m = _mapping(d, "pool state")
        pools = _mapping(m.get("pools"), "pools")
        return cls(
            version=int(_num(m, "version")),
            ts=_num(m, "ts"),
            pools={str(k): PoolSummary.from_json(v) for k, v in pools.items()},
        )


def _round(x: float) -> float:
    return round(x, 4) if math.isfinite(x) else SATURATED


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else SATURATED


def _mapping(d: object, what: str) -> Mapping[str, object]:
    if not isinstance(d, Mapping):
        raise PoolStateDecodeError(f"{what}: expected an object, got {type(d).__name__}")
    return d


def _num(m: Mapping[str, object], key: str) -> float:
    v = m.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise PoolStateDecodeError(f"{key}: expected a number, got {v!r}")
    return float(v)


def _bool(m: Mapping[str, object], key: str) -> bool:
    v = m.get(key)
    if not isinstance(v, bool):
        raise PoolStateDecodeError(f"{key}: expected true or false, got {v!r}")
    return v
