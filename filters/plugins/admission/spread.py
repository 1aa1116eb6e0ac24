"""Lane balance: which replica of a ranked pool an admitted request goes to.

A replica that schedules by priority (``pools.NAME.priority_scheduling``) lets a request preempt
the running ones more than the threshold below it; what delays it there is the work it cannot
preempt. Envoy's ring hash with bounded load balances *all* active requests, so one replica can
fill with interactive requests (which queue behind each other) while another runs batch that
an interactive request would have preempted at once; on a pool whose prefill is the bottleneck,
an uneven interactive split is a queue on one replica (measured: docs/benchmarks.md).

So the filter server names the replica for every admitted request to such a pool
(``pool.balances_lanes``; header ``x-tokenweir-endpoint``, honoured by Envoy's override-host load
balancer, ring hash the fallback when the host is unhealthy or gone):

* the *blocking* load of a replica for a request is the number of requests in flight there
  (this filter process's count, from admission to the stream's end) that the request cannot
  preempt: for interactive, interactive; for batch, everything;
* a request with a session key (the first of the pool's affinity headers the client sent)
  goes to its rendezvous-hash replica among those whose blocking load stays within the pool's
  bounded load (``hash_balance_factor``, default 125%, of the mean, as Envoy's ring hash
  bounds it), so a conversation keeps its prefix cache while the pool is balanced;
* without one, the least blocking load wins, then the least load in all, then a rendezvous
  hash of a per-request tie key (ties do not pile onto the first replica).

Two gateway replicas each balance their own share; the replicas see the sum. Replicas the pool
state marks unhealthy or stale are skipped (every one: none is named, ring hash decides). While
admission does not trust the pool to rank (a replica reports otherwise: ``PoolGate.check_ranking``)
every request in flight counts as blocking, as on a pool that does not preempt.
"""

from __future__ import annotations

import collections
import contextlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Gauge

from filters.rendezvous import rendezvous
from policy.model import Policy
from poolstate.state import ReplicaState

__all__ = ["LaneBalance", "PoolBalance", "choose", "replicas_down"]

_DEFAULT_FACTOR = 1.25  # bounded load without a hash_balance_factor in the policy

Preempts = Callable[[int, int], bool]  # (mine, theirs) → mine may preempt theirs


def choose(
    loads: Mapping[str, Mapping[int, int]],
    priority: int,
    preempts: Preempts,
    *,
    key: bytes | None,
    tie: bytes,
    factor: float = _DEFAULT_FACTOR,
) -> str | None:
    """Pure: the replica for a request of ``priority``; ``loads`` holds, per candidate replica,
    its requests in flight by priority. None without candidates. See the module docstring."""
    if not loads:
        return None
    blocking = {
        name: sum(n for p, n in by_prio.items() if not preempts(priority, p))
        for name, by_prio in loads.items()
    }
    if key is not None:
        bound = max(1, math.ceil(factor * (sum(blocking.values()) + 1) / len(blocking)))
        allowed = [n for n, b in blocking.items() if b + 1 <= bound]
        if not allowed:
            low = min(blocking.values())
            allowed = [n for n, b in blocking.items() if b == low]
        return max(allowed, key=lambda n: rendezvous(key, n))
    totals = {name: sum(by_prio.values()) for name, by_prio in loads.items()}
    return min(blocking, key=lambda n: (blocking[n], totals[n], -rendezvous(tie, n)))


def _never(mine: int, theirs: int) -> bool:
    return False


@dataclass
class PoolBalance:
    """One ranked pool's requests in flight, per replica and priority (this process)."""

    replicas: tuple[str, ...]
    preempts: Preempts
    factor: float
    key_headers: tuple[str, ...]
    inflight: dict[str, collections.Counter[int]] = field(default_factory=dict)

    def pick(
        self,
        priority: int,
        headers: Mapping[str, str],
        tie: bytes,
        down: frozenset[str],
        ranked: bool = True,
    ) -> str | None:
        loads = {r: self.inflight.get(r, collections.Counter()) for r in self.replicas}
        for name in down:
            loads.pop(name, None)
        key = next((headers[h] for h in self.key_headers if headers.get(h)), None)
        return choose(
            loads,
            priority,
            self.preempts if ranked else _never,
            key=key.encode() if key is not None else None,
            tie=tie,
            factor=self.factor,
        )

    def start(self, name: str, priority: int) -> None:
        self.inflight.setdefault(name, collections.Counter())[priority] += 1

    def done(self, name: str, priority: int) -> None:
        held = self.inflight.get(name)
        if held is not None and held[priority] > 0:
            held[priority] -= 1
            if held[priority] == 0:
                del held[priority]


# pool → replicas the pool state marks down (None: the pool state is stale or lacks the pool)
Down = Callable[[str], Iterable[str] | None]


class LaneBalance:
    """Every balanced pool of this filter process; ``configure`` follows policy reloads (the
    counts of requests in flight are kept for the replicas that remain)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.pools: dict[str, PoolBalance] = {}
        self.down: Down | None = None
        self._seq = 0
        self._lanes: dict[int, str] = {}  # the priority each lane carries → the lane
        self.gauge = Gauge(
            "tokenweir_admission_replica_in_flight",
            "requests this process sent to a replica of a pool balanced by lane, in flight",
            ["pool", "replica", "lane"],
            registry=registry if registry is not None else CollectorRegistry(),
        )

    def configure(self, policy: Policy) -> None:
        pools: dict[str, PoolBalance] = {}
        self._lanes = {}
        for lane in ("batch", "interactive"):  # equal priorities: the higher lane's name
            value = policy.admission.priority(lane)
            self._lanes[value] = self._lanes[-value] = lane
        for old_pool in self.pools:
            self._clear(old_pool)
        for name, pool in policy.pools.items():
            if not pool.balances_lanes:
                continue
            replicas = tuple(f"{ep.host}:{ep.port}" for ep in pool.endpoints)
            factor = pool.affinity.hash_balance_factor
            old = self.pools.get(name)
            pools[name] = PoolBalance(
                replicas,
                pool.priority_scheduling.preempts,
                factor / 100 if factor is not None else _DEFAULT_FACTOR,
                tuple(h.lower() for h in pool.affinity.headers),
                {r: c for r, c in old.inflight.items() if r in replicas} if old else {},
            )
        self.pools = pools
        for name in pools:
            self._show(name)

    def pick(
        self, pool: str, priority: int, headers: Mapping[str, str], *, ranked: bool = True
    ) -> str | None:
        """The replica to name for an admitted request, counted in flight there; None: the
        pool is not balanced by lane or has no replica up (ring hash decides). ``ranked``
        False (a replica contradicts the policy: admission fell back to counting every slot):
        every request in flight blocks, as on a pool that does not preempt."""
        balance = self.pools.get(pool)
        if balance is None:
            return None
        self._seq += 1
        marked = self.down(pool) if self.down is not None else None
        down = frozenset(marked) if marked is not None else frozenset()
        name = balance.pick(priority, headers, self._seq.to_bytes(8, "little"), down, ranked)
        if name is not None:
            balance.start(name, priority)
            self._show(pool, name)
        return name

    def done(self, pool: str, name: str, priority: int) -> None:
        balance = self.pools.get(pool)
        if balance is not None:
            balance.done(name, priority)
            self._show(pool, name)

    def _show(self, pool: str, only: str | None = None) -> None:
        balance = self.pools[pool]
        for replica in (only,) if only is not None else balance.replicas:
            held = balance.inflight.get(replica, collections.Counter())
            by_lane = dict.fromkeys(("interactive", "batch"), 0)
            for priority, n in held.items():
                lane = self._lanes.get(priority, "batch")
                by_lane[lane] += n
            for lane, n in by_lane.items():
                self.gauge.labels(pool, replica, lane).set(n)

    def _clear(self, pool: str) -> None:
        for replica in self.pools[pool].replicas:
            for lane in ("interactive", "batch"):
                with contextlib.suppress(KeyError):
                    self.gauge.remove(pool, replica, lane)


def replicas_down(states: Mapping[str, ReplicaState]) -> Sequence[str]:
    """Pure: the replicas of a pool state summary (``endpoints``) that did not answer lately."""
    return [name for name, r in states.items() if not r.healthy or r.stale]
