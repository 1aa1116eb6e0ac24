"""The waiting side of admission: one :class:`PoolGate` per pool turns the pure core's tickets
into awaitable slots; :class:`Gates` holds them across policy reloads (in-flight requests keep
their slots when the policy changes).

A waiter is woken by a release (no timer task per waiter runs except its own bounded wait), or
answered early when the core's :meth:`~filters.plugins.admission.core.Admission.sweep` finds it can no
longer start in time (run at most every ``SWEEP_EVERY`` seconds, as requests arrive); a waiter
cancelled (client abort: Envoy resets the ext_proc stream) leaves the queue or frees the slot it
was just given.

A pool that declares ``priority_scheduling`` is admitted preemptively only while no replica
that answers reports otherwise (:meth:`PoolGate.check_ranking`, from the pool state): one
that runs without SGLang's ``--enable-priority-scheduling`` (or with another threshold or
order) would queue interactive requests behind batch, so admission then counts every slot
for every lane, as for a pool that does not rank. Unknown (no pool state, a replica that does
not say) keeps the policy's word.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import replace

from prometheus_client import CollectorRegistry

from filters.plugins.admission.core import Admission, LaneConfig, Shed
from filters.plugins.admission.herd import Stagger
from filters.plugins.admission.limits import (
    lane_configs,
    pool_limits,
    preemptive,
    process_share,
    process_split,
    saturated_limit,
)
from filters.plugins.admission.metrics import AdmissionMetrics
from filters.plugins.admission.queues import LaneQueue, Ticket
from filters.plugins.admission.shared import SharedReturns
from policy.model import Policy
from poolstate.ranking import Declared, pool_mismatch
from poolstate.state import ReplicaState

__all__ = [
    "AdmissionMetrics",
    "CapacitySource",
    "Gates",
    "PoolGate",
    "RankingSource",
    "ReadySource",
    "SaturationSource",
]

log = logging.getLogger("tokenweir.admission")

SaturationSource = Callable[[str], float | None]  # pool name → saturation (None: unknown)
# pool name → its replicas as the pool state last said (None: unknown, the policy is trusted)
RankingSource = Callable[[str], Mapping[str, ReplicaState] | None]
# pool name → requests the whole pool runs at once by what its answering replicas report
# (their /get_server_info ``max_running_requests``: signal.pool_capacity; None: unknown)
CapacitySource = Callable[[str], int | None]
# pool name → seconds until a replica it is starting should serve (None: none starting, or
# unknown: signal.ready_source)
ReadySource = Callable[[str], float | None]
SWEEP_EVERY = 0.05  # seconds between two looks at the queued tickets' predicted starts


class PoolGate:
    """One pool's admission in this process."""

    def __init__(
        self,
        name: str,
        core: Admission,
        *,
        clock: Callable[[], float],
        metrics: AdmissionMetrics,
    ) -> None:
        self.name = name
        self.core = core
        self.clock = clock
        self.metrics = metrics
        self.base_limit = core.max_requests
        self.base_tokens = core.max_tokens
        # the policy's capacity (None: it declares none, and the replicas' reported one is used)
        self.declared_limit = core.max_requests
        self.split = 1  # filter processes sharing the pool (limits.process_split)
        self.reported: int | None = None  # the pool's reported capacity the limit follows
        self.declared: Declared | None = None  # the pool's priority scheduling, when enabled
        self.unranked: str | None = None  # which replica contradicts it and how (None: none)
        # what the last check read (held, so that ``is`` means the same state)
        self._ranking_seen: tuple[object, object] | None = None
        self._waiters: dict[Ticket, asyncio.Future[Shed | None]] = {}
        self._swept = -math.inf
        self._returns: dict[str, tuple[int, int]] = {}  # lane → (claimed, expired) counted
        self.shared: SharedReturns | None = None  # promises seen by every filter process
        # the batch runners' lines running (poolstate/valley.py): left out of :meth:`demand`
        self._valley: set[Ticket] = set()

    async def acquire(
        self,
        lane: str,
        tenant: str,
        *,
        weight: float = 1.0,
        tokens: int = 0,
        deadline: float | None = None,
        on_wait: Callable[[float], Awaitable[None]] | None = None,
        key: Hashable | None = None,
        returned: bool = False,
        valley: bool = False,
    ) -> Ticket | Shed:
        """A running slot, after waiting if need be, or the answer to send instead.
        ``on_wait(seconds)`` is awaited before waiting (to extend Envoy's message timeout);
        ``key`` recognises the client when it comes back as a ``Retry-After`` told it;
        ``returned``: another filter process's promise was already kept for it
        (:meth:`returning`, the ladder's shed step let it through); ``valley``: a batch
        runner's line, which :meth:`demand` leaves out while it runs."""
        now = self.clock()
        shared = self.shared
        if (
            not returned
            and shared is not None
            and key is not None
            and not self.core.told[lane].claimable(now, key)
            and not self.core.starts_at_once(now, lane, tokens)
        ):  # a place another filter process promised it counts only where it would wait
            returned = await shared.take(self.name, lane, key)
            now = self.clock()
        r = self.core.offer(
            now, lane, tenant, weight=weight, tokens=tokens, deadline=deadline, key=key,
            returned=returned,
        )  # fmt: skip
        if isinstance(r, Shed):
            self._shed(lane, r, key)
            return r
        r.valley = valley
        if shared is not None and r.returning and not returned:
            shared.forget(self.name, lane, key)  # kept here: nowhere else
        if r.state == "admitted":
            self._admitted(r, "at_once", now)
            return r
        fut: asyncio.Future[Shed | None] = asyncio.get_running_loop().create_future()
        self._waiters[r] = fut
        self._gauges()
        try:
            if on_wait is not None:
                await on_wait(r.start_by - now)
            async with asyncio.timeout(max(0.0, r.start_by - self.clock())):
                early = await fut
        except TimeoutError:
            if r.state == "admitted":  # woken at the very end: keep it
                self._admitted(r, "queued", self.clock())
                return r
            # swept at the very end (the timeout cancels the future it interrupts, otherwise)
            early = fut.result() if fut.done() and not fut.cancelled() else None
            if early is None:
                shed, started = self.core.drop(self.clock(), r)
                self._wake(started)
                assert shed is not None
                self._shed(lane, shed, key)
                return shed
        except BaseException:  # cancelled (client gone): leave the queue or free the slot
            self.release(r)
            raise
        finally:
            self._waiters.pop(r, None)
            self._gauges()
        if early is not None:  # swept: it could no longer start in time
            self._shed(lane, early, key)
            return early
        self._admitted(r, "queued", self.clock())
        return r

    def demand(self) -> float | None:
        """This process's requests in flight and queued for the pool, and the slots the fresh
        requests the ladder's shed step refused would hold (:meth:`turned_away`), against its
        limit (1: every slot taken; 2: as many more waiting); None while the pool is not
        limited. What the shed step refuses stays in the reading: the ladder leaves the step
        when that demand fits, not when the refusing has emptied the queue."""
        limit = self.base_limit  # the capacity's share, not the limit saturation lowered
        if not limit:
            return None
        core = self.core
        # a batch runner's lines running are not overload: the runner yields them itself
        # (poolstate/valley.py); queued, they are demand the pool cannot serve now
        held = core.in_flight - len(self._valley) + sum(len(q) for q in core.queues.values())
        return (held + core.refused_slots(self.clock())) / limit

    def expected(self) -> float | None:
        """The part of :meth:`demand` that was planned: clients queued for the place a
        ``Retry-After`` promised them (None while the pool is not limited). The ladder holds a
        step for them but takes none: they are the storm's demand coming back, not a new one."""
        limit = self.base_limit
        if not limit:
            return None
        return sum(q.returning for q in self.core.queues.values()) / limit

    async def returning(self, lane: str, key: Hashable) -> tuple[bool, bool]:
        """Whether a client of ``lane`` is back as a ``Retry-After`` told it, here or (through
        :mod:`.shared`) in another filter process: (back, kept elsewhere). The ladder's shed step
        lets such a client through to its promised place; a promise of another process is
        kept by this call (pass ``returned=True`` to :meth:`acquire`)."""
        if self.core.told[lane].claimable(self.clock(), key):
            return True, False
        if self.shared is None:
            return False, False
        kept = await self.shared.take(self.name, lane, key)
        return kept, kept

    def turned_away(self, lane: str, key: Hashable | None) -> None:
        """A request of ``lane`` refused before the queue (the ladder's shed): counted as
        demand when fresh (:meth:`Admission.turn_away`). Call before :meth:`retry_after`."""
        self.core.turn_away(self.clock(), lane, key)

    def stopped_refusing(self) -> None:
        """The ladder left its shed step: the demand it refused is admitted (or shed by
        admission) from now on and counted there, not twice."""
        self.core.clear_refused()

    def retry_after(self, lane: str, tenant: str, key: Hashable | None) -> float:
        """When a client of ``lane`` turned away before the queue (the degradation ladder's
        shed) should come back: the lane's measured drain, as for one this gate sheds; the
        client is counted among those told to return (its ``key`` goes first when it does)."""
        wait = self.core.retry_after(self.clock(), lane, key=key, tenant=tenant)
        self._share(lane, key)
        return wait

    def release(self, ticket: Ticket, settled: float | None = None) -> None:
        """The request ended (or never started): its slot goes to the next waiter;
        ``settled``: the tokens its usage settled, when known here (its tenant's counter)."""
        self._valley.discard(ticket)
        self._wake(self.core.release(self.clock(), ticket, settled))

    def set_limits(self, max_requests: int | None, max_tokens: int | None) -> None:
        self.base_limit, self.base_tokens = max_requests, max_tokens
        self.metrics.limit.labels(self.name).set(max_requests or 0)
        self.core.preempt_limit = max_requests
        self._wake(self.core.set_capacity(self.clock(), max_requests, max_tokens))

    def follow_reported(self, total: int | None) -> None:
        """A pool whose policy declares no ``capacity.max_running_requests`` is admitted against
        what its answering replicas report (``total``, from the pool state); unknown (None, or
        no replica answers) keeps the last figure, and nothing is limited before the first."""
        if not total or total == self.reported or self.declared_limit is not None:
            return
        limit = process_share(total, self.split)
        log.info(
            "pool %s: admitting up to %d requests in this filter process: its replicas report "
            "%d running slots (/get_server_info max_running_requests), split over %d; "
            "set pools.%s.capacity.max_running_requests to fix the figure",
            self.name, limit, total, self.split, self.name,
        )  # fmt: skip
        self.reported = total
        self.set_limits(limit, self.base_tokens)

    def observe(self, saturation: float | None, alive: float | None = None) -> None:
        """Admit fewer while the pool is saturated (pool state), the policy's limit again after;
        and start waiters the passing of time lets in (a higher lane's reserve fades as its
        measured demand falls: no release need come first). ``alive`` (the share of replicas
        that answer) scales the limit of the lanes that preempt lower ones: saturation does not
        lower theirs (the replicas' queues may hold preempted batch), a dead replica does."""
        now = self.clock()
        limit = saturated_limit(self.base_limit, saturation)
        preempt = self.base_limit
        if preempt is not None and alive is not None:
            preempt = max(1, math.floor(preempt * min(1.0, max(0.0, alive))))
        self.core.preempt_limit = preempt  # the pump below admits who it lets in
        if limit != self.core.max_requests:
            self._wake(self.core.set_capacity(now, limit, self.base_tokens))
        elif self._waiters:
            started = self.core.pump(now)
            if started:
                self._wake(started)
        if self._waiters and now - self._swept >= SWEEP_EVERY:
            self._swept = now
            self.sweep(now)

    def check_ranking(self, replicas: Mapping[str, ReplicaState] | None) -> None:
        """Preemptive admission while the pool declares priority scheduling and no answering
        replica in ``replicas`` (the pool state; None: unknown) reports otherwise; a warning
        each time what differs changes, not per request."""
        want = self.declared
        seen = self._ranking_seen
        if seen is not None and seen[0] is replicas and seen[1] is want:
            return  # the same pool state as last time (the reader keeps it until a new one)
        self._ranking_seen = (replicas, want)
        why = pool_mismatch(replicas, want) if want is not None and replicas else None
        if why != self.unranked:
            if why is not None:
                log.warning(
                    "pool %s: replica %s, but pools.%s.priority_scheduling is enabled: admission "
                    "counts every slot for every lane until the replicas rank as declared",
                    self.name, why, self.name,
                )  # fmt: skip
            else:
                log.warning(
                    "pool %s: no answering replica contradicts priority_scheduling now%s: "
                    "interactive is admitted past the slots batch holds again",
                    self.name, "" if replicas is not None else " (no fresh pool state)",
                )  # fmt: skip
            self.unranked = why
        ranked = want is not None and why is None
        if ranked != self.core.preemptive:
            self.core.preemptive = ranked
            self.metrics.ranked.labels(self.name).set(1 if ranked else 0)

    def sweep(self, now: float) -> None:
        """Answer at once the waiters that can no longer start in time; start who fits then."""
        for ticket, shed in self.core.sweep(now):
            fut = self._waiters.get(ticket)
            if fut is not None and not fut.done():
                fut.set_result(shed)
        self._wake(self.core.pump(now))

    def set_lanes(self, lanes: list[LaneConfig]) -> None:
        for cfg in lanes:
            self.core.lanes[cfg.name] = cfg
            q: LaneQueue = self.core.queues[cfg.name]
            q.bound, q.tenant_bound = cfg.max_queue, cfg.max_queue_per_tenant

    def _wake(self, started: list[Ticket]) -> None:
        for t in started:
            fut = self._waiters.get(t)
            if fut is not None and not fut.done():
                fut.set_result(None)
        self._gauges()

    def _admitted(self, t: Ticket, how: str, now: float) -> None:
        if t.valley:
            self._valley.add(t)
        self.metrics.admitted.labels(self.name, t.lane, how).inc()
        self.metrics.wait.labels(self.name, t.lane).observe(now - t.arrived)
        self._gauges()

    def _shed(self, lane: str, shed: Shed, key: Hashable | None) -> None:
        self.metrics.shed.labels(self.name, lane, shed.reason).inc()
        self._share(lane, key)

    def kept_elsewhere(self, lane: str, key: Hashable) -> None:
        """Another filter process kept the promise this one made to ``key``."""
        told = self.core.told.get(lane)
        if told is not None and told.kept_elsewhere(self.clock(), key):
            self._gauges()

    def _share(self, lane: str, key: Hashable | None) -> None:
        """Publish the promise just made to ``key`` (if one was: a tenant past its bound of
        places gets none) for the other filter processes."""
        if self.shared is None or key is None:
            return
        window = self.core.told[lane].window_of(key)
        if window is not None:
            now = self.clock()
            self.shared.publish(self.name, lane, key, window[0] - now, window[1] - now)

    def _gauges(self) -> None:
        m = self.metrics
        for lane, q in self.core.queues.items():
            m.queued.labels(self.name, lane).set(len(q))
        m.in_flight.labels(self.name).set(self.core.in_flight)
        m.limit.labels(self.name).set(self.core.max_requests or 0)
        for lane, told in self.core.told.items():
            seen = self._returns.get(lane, (0, 0))
            if (told.claimed, told.expired) != seen:
                self._returns[lane] = (told.claimed, told.expired)
                m.returns.labels(self.name, lane, "claimed").inc(told.claimed - seen[0])
                m.returns.labels(self.name, lane, "expired").inc(told.expired - seen[1])
        now = self.clock()
        for lane in self.core.order[1:]:
            m.reserved.labels(self.name, lane).set(self.core.reserved_above(now, lane))


class Gates:
    """Every pool's gate in this filter process; ``configure`` follows policy reloads."""

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        wall: Callable[[], float],
        registry: CollectorRegistry | None = None,
        saturation: SaturationSource | None = None,
        rng: random.Random | None = None,
        alive: SaturationSource | None = None,
        ranking: RankingSource | None = None,
        capacity: CapacitySource | None = None,
        local: int | None = None,
    ) -> None:
        self.clock = clock
        self.local = local  # this gateway's filter processes (None: the policy's; process_split)
        self.rng = rng  # jitter of the Retry-After told to shed clients (None: none)
        self.wall = wall
        self.saturation = saturation
        self.alive = alive  # pool → share of its replicas that answer (preemptive lanes)
        self.ranking = ranking  # pool → its replicas' priority scheduling (preemptive pools)
        self.capacity = capacity  # pool → its replicas' reported running slots (no declared one)
        self.ready_in: ReadySource | None = None  # pool → seconds until a starting replica serves
        self._stagger = Stagger()  # the clients promised a starting replica, one second apart
        self.metrics = AdmissionMetrics(registry if registry is not None else CollectorRegistry())
        self._gates: dict[str, PoolGate] = {}
        self._shared: SharedReturns | None = None

    def promise(self, pool: str, shed: Shed) -> Shed:
        """``shed`` with its Retry-After cut to when a replica ``pool`` is starting should serve
        (a scale-up under way, from the pool state), where that is sooner; else ``shed``. The
        clients told so while one replica loads are told one second apart (:class:`Stagger`),
        over as long again as the wait, never past what they would have been told.
        Admission and the ladder size the pool by the replicas that serve; only the promise
        of when to come back knows that more capacity is on its way."""
        ready_in = self.ready_in(pool) if self.ready_in is not None else None
        if ready_in is None or ready_in >= shed.retry_after:
            return shed
        self.metrics.scale_up_promises.labels(pool).inc()
        at = max(1.0, ready_in)
        # spread over as long again as the wait (never past the promise without the scale-up)
        width = min(shed.retry_after, at + at) - at
        at += self._stagger.offset(pool, self.wall() + ready_in, width)
        return replace(shed, retry_after=min(shed.retry_after, at))

    def share_returns(self, shared: SharedReturns | None) -> None:
        """Every pool's promises go through ``shared`` from now on (None: this process's own),
        where admission is split over several filter processes (:func:`limits.process_split`)."""
        self._shared = shared
        for g in self._gates.values():
            g.shared = shared if g.split > 1 else None
        if shared is not None:
            shared.on_kept = self._kept_elsewhere

    def _kept_elsewhere(self, pool: str, lane: str, key: Hashable) -> None:
        g = self._gates.get(pool)
        if g is not None:
            g.kept_elsewhere(lane, key)

    def configure(self, policy: Policy) -> None:
        lanes = lane_configs(policy)
        split = process_split(policy, self.local)
        for name in policy.pools:
            limit, tokens = pool_limits(policy, name, self.local)
            gate = self._gates.get(name)
            if gate is None:
                core = Admission(lanes, max_requests=limit, max_tokens=tokens, rng=self.rng)
                gate = PoolGate(name, core, clock=self.clock, metrics=self.metrics)
                self._gates[name] = gate
            else:
                gate.set_lanes(lanes)
            gate.declared_limit, gate.split = limit, split
            gate.shared = self._shared if split > 1 else None  # nobody else to tell: alone
            if limit is None and gate.reported is not None:  # keep following the replicas
                limit = process_share(gate.reported, split)
            declared = policy.pools[name].priority_scheduling
            gate.declared = declared if preemptive(policy, name) else None
            gate.check_ranking(self.ranking(name) if self.ranking is not None else None)
            gate.metrics.ranked.labels(name).set(1 if gate.core.preemptive else 0)
            gate.set_limits(limit, tokens)

    def follow_reported(self) -> None:
        """Every pool that declares no capacity takes the one its replicas report now: the
        filter server calls this at each new pool state (off the request path)."""
        if self.capacity is None:
            return
        for name, g in self._gates.items():
            if g.declared_limit is None:
                g.follow_reported(self.capacity(name))

    def pools(self) -> Mapping[str, PoolGate]:
        """Every pool's gate (read-only: :meth:`configure` changes them)."""
        return self._gates

    def settled(self, pool: str, lane: str | None, tenant: str | None, tokens: float) -> None:
        """A request of ``pool`` settled ``tokens`` (its usage, from Envoy's meter: the access
        log brings it after the stream ended) for ``tenant``'s counter in ``lane``."""
        g = self._gates.get(pool)
        if g is not None and lane is not None:
            g.core.settle(self.clock(), lane, tenant or "anonymous", tokens)

    def demand(self, pool: str) -> float | None:
        """:meth:`PoolGate.demand` of the pool (None: no gate, or not limited): the degradation
        ladder reads it beside the pool state's saturation."""
        g = self._gates.get(pool)
        return g.demand() if g is not None else None

    def expected(self, pool: str) -> float | None:
        """:meth:`PoolGate.expected` of the pool (None: no gate, or not limited)."""
        g = self._gates.get(pool)
        return g.expected() if g is not None else None

    def stopped_refusing(self, pool: str) -> None:
        """:meth:`PoolGate.stopped_refusing` of the pool (the ladder calls it on a step down)."""
        g = self._gates.get(pool)
        if g is not None:
            g.stopped_refusing()

    def gate(self, pool: str) -> PoolGate | None:
        g = self._gates.get(pool)
        if g is not None:
            if self.ranking is not None:
                g.check_ranking(self.ranking(pool))
            alive = self.alive(pool) if self.alive is not None else None
            g.observe(self.saturation(pool) if self.saturation is not None else None, alive)
        return g
