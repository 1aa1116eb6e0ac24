"""Priority admission for one pool, pure: bounded lane queues released as capacity frees.

* Lanes are in strict priority order (interactive before batch): a freed slot goes to the
  highest lane with a waiting ticket that fits; a lower lane never overtakes a higher one.
* Inside a lane, tenants share by weight (:class:`~filters.admission.queues.LaneQueue`).
* Capacity: in-flight requests (and, when declared, in-flight tokens) against the pool's
  limit; each lane may hold at most ``max_share`` of the running slots, and a lane with
  ``leave_for_higher`` leaves free the slots the lanes above it are measured to need (their
  offered rate × hold time, plus that headroom: :mod:`filters.admission.demand`).
* Each lane's queue has a bound, a per-tenant bound and a longest wait. A ticket that cannot
  start in time is shed at once: queue full, or its predicted wait is longer than it may wait.
  The wait is predicted from what holds the pool now (:mod:`filters.admission.forecast`: the
  lane's room under the lanes above and their reserve, its hold time, the pool's completions),
  not from the lane's grant rate alone, which is measured over a window and lags. A queued
  ticket whose predicted start has moved past its wait budget is shed then (:meth:`sweep`,
  ``fell_behind``), not when the budget is gone; ``timed_out`` stays the last resort (and the
  only one for a client back when told: it waits its wait out for the place it was promised).
  ``Retry-After`` comes from the lane's measured drain rate; a lane blocked by the lanes above
  is told no sooner than their need could fade, nor than its own measured starts allow.
* A ``Retry-After`` is a promise (:mod:`filters.admission.herd`): a client that comes back
  when told (its ``key``) goes before the fresh tickets of its lane, and fresh tickets count the
  clients due back before they could start.
* Preemptive pools (``preemptive``: the backends schedule by request priority and preempt a
  running lower-priority request for a higher one, SGLang's ``--enable-priority-scheduling``):
  a lane above the lowest counts only the slots its own and the higher lanes hold against the
  pool's declared limit (``preempt_limit``, not lowered by saturation: the backends' queues then
  hold the preempted lower-lane requests), so a batch burst never makes interactive wait. The
  lowest lane still counts every slot against the limit as lowered by saturation.

Every method takes ``now`` (the caller's clock); nothing here sleeps or does I/O. (About 450
lines: the four events and the predictions read the same lane state; the pure pieces they
share live in ``queues``, ``demand``, ``forecast``, ``herd`` and ``drain``.)
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from filters.admission.demand import Demand
from filters.admission.drain import DrainMeter
from filters.admission.forecast import Outlook, fade
from filters.admission.herd import Promises
from filters.admission.queues import LaneQueue, Ticket

__all__ = ["Admission", "LaneConfig", "Shed"]

MAX_RETRY_AFTER = 300.0  # seconds; Envoy's rate_limited_retry_back_off reads at most this
JITTER = 0.1  # a told wait is stretched by up to this share (with an rng), so returns spread


@dataclass(frozen=True, slots=True)
class LaneConfig:
    name: str
    max_queue: int
    max_queue_per_tenant: int
    max_wait: float
    max_share: float = 1.0
    leave_for_higher: float | None = None  # headroom over the higher lanes' demand; None: off


@dataclass(frozen=True, slots=True)
class Shed:
    """A request answered at once instead of queued: 503 (capacity) or 504 (deadline)."""

    status: int
    # queue_full | tenant_queue_full | wait_too_long | fell_behind | timed_out | deadline
    reason: str
    retry_after: float  # seconds, from the lane's predicted drain rate

    @property
    def retry_after_s(self) -> int:
        """Whole seconds for the ``Retry-After`` header (at least 1)."""
        return max(1, math.ceil(self.retry_after))


class Admission:
    """Lanes (highest priority first) in front of one pool's capacity."""

    def __init__(
        self,
        lanes: Sequence[LaneConfig],
        *,
        max_requests: int | None,
        max_tokens: int | None = None,
        window: float = 10.0,
        rng: random.Random | None = None,
    ) -> None:
        if not lanes:
            raise ValueError("at least one lane")
        self.lanes = {c.name: c for c in lanes}
        self.order = tuple(c.name for c in lanes)
        self.queues = {
            c.name: LaneQueue(c.name, c.max_queue, c.max_queue_per_tenant) for c in lanes
        }
        self.max_requests = max_requests
        self.max_tokens = max_tokens
        self.in_flight = 0
        self.in_flight_tokens = 0
        self.lane_in_flight = dict.fromkeys(self.order, 0)
        self.lane_tokens = dict.fromkeys(self.order, 0)
        self.preemptive = False  # the backends preempt lower-priority running requests
        self.preempt_limit: int | None = None  # the lanes that preempt count to this (None: max)
        self.granted = {c.name: DrainMeter(window) for c in lanes}
        self.completed = DrainMeter(window)
        self.demand = {c.name: Demand(window) for c in lanes}
        self.told = {c.name: Promises() for c in lanes}
        self.rng = rng  # None: no jitter (deterministic answers)
        self._seq = itertools.count()

    # -- the four events -------------------------------------------------------------------
    def offer(
        self,
        now: float,
        lane: str,
        tenant: str,
        *,
        weight: float = 1.0,
        tokens: int = 0,
        deadline: float | None = None,
        key: Hashable | None = None,
    ) -> Ticket | Shed:
        """A new request: admitted (``state == "admitted"``), queued, or shed at once. ``key``
        recognises a client that comes back when its ``Retry-After`` said (:mod:`.herd`)."""
        cfg = self.lanes[lane]
        self.demand[lane].offer(now)
        if deadline is not None and deadline <= now:
            return Shed(504, "deadline", self.retry_after(now, lane))
        back = key is not None and self.told[lane].claim(now, key)
        start_by = now + cfg.max_wait
        if deadline is not None:
            start_by = min(start_by, deadline)
        t = Ticket(next(self._seq), lane, tenant, weight, tokens, now, start_by, deadline, key=key)
        t.returning = back
        q = self.queues[lane]
        before = q.returning if back else len(q)  # who in its lane goes first
        if not self._waiting_above(lane) and not before and self._fits(t, now):
            self._grant(now, t)
            return t
        why = q.refusal(tenant, returning=back)
        if why is not None:
            return Shed(503, why, self.retry_after(now, lane, extra=len(q), key=key, tenant=tenant))
        # a client back when told waits (up to its wait) for the place it was promised
        predicted = None if back else self.predicted_wait(now, lane, tenant, weight, start_by - now)
        if predicted is not None and predicted > start_by - now:
            late_for_client = deadline is not None and deadline == start_by
            return Shed(
                504 if late_for_client else 503,
                "deadline" if late_for_client else "wait_too_long",
                self.retry_after(
                    now, lane, extra=self._ahead(lane, tenant, weight), key=key, tenant=tenant
                ),
            )
        q.push(t)
        if q.peek() is t and not self._waiting_above(lane) and self._fits(t, now):
            # tenant fairness can make a newcomer the head of a lane whose old head does not
            # fit (too many tokens): the newcomer starts now if it fits
            q.pop()
            self._grant(now, t)
        return t

    def release(self, now: float, ticket: Ticket) -> list[Ticket]:
        """An admitted request ended (or was aborted); returns the tickets now admitted."""
        if ticket.state == "queued":  # a new head may fit where the old one did not
            self.queues[ticket.lane].remove(ticket)
            ticket.state = "dropped"
            return self.pump(now)
        if ticket.state != "admitted":
            return []
        ticket.state = "done"
        self.in_flight -= 1
        self.in_flight_tokens -= ticket.tokens
        self.lane_in_flight[ticket.lane] -= 1
        self.lane_tokens[ticket.lane] -= ticket.tokens
        self.completed.record(now)
        self.demand[ticket.lane].held(now - ticket.granted_at)
        return self.pump(now)

    def drop(self, now: float, ticket: Ticket) -> tuple[Shed | None, list[Ticket]]:
        """A queued ticket gives up (its wait or deadline ran out): the answer it gets, and
        the tickets its leaving admits. An admitted ticket is released instead (no answer)."""
        if ticket.state != "queued":
            return None, self.release(now, ticket)
        if ticket.deadline is not None and ticket.deadline <= now:
            shed = Shed(504, "deadline", self.retry_after(now, ticket.lane))
        else:
            shed = Shed(503, "timed_out", self.retry_after(
                now, ticket.lane, key=ticket.key, tenant=ticket.tenant
            ))  # fmt: skip
        return shed, self.release(now, ticket)

    def sweep(self, now: float) -> list[tuple[Ticket, Shed]]:
        """Queued tickets whose predicted start has moved past the latest they may start (the
        pool slowed, the lanes above asked for more), taken out of their queues with the
        answer each gets: 503 ``fell_behind`` (504 ``deadline`` where the client's deadline is
        what runs out). Call :meth:`pump` after: a new head may fit where the old one did not."""
        out: list[tuple[Ticket, Shed]] = []
        for lane in self.order:  # a higher lane's sheds shorten the waits below it
            q = self.queues[lane]
            if not len(q):
                continue
            outlook = self.outlook(now, lane)
            if outlook is None:  # nothing measured: their wait bound decides
                continue
            gone = 0
            for t, ahead in q.ranked():
                if t.returning or now + outlook.wait(max(0, ahead - gone)) <= t.start_by:
                    continue  # (a client back when told waits its wait out for its place)
                gone += 1
                q.remove(t)
                t.state = "dropped"
                late_for_client = t.deadline is not None and t.deadline == t.start_by
                out.append((t, Shed(
                    504 if late_for_client else 503,
                    "deadline" if late_for_client else "fell_behind",
                    self.retry_after(now, lane, extra=ahead, key=t.key, tenant=t.tenant),
                )))  # fmt: skip
        return out

    def set_capacity(
        self, now: float, max_requests: int | None, max_tokens: int | None
    ) -> list[Ticket]:
        """New limits (pool state, policy reload); returns the tickets now admitted."""
        self.max_requests, self.max_tokens = max_requests, max_tokens
        return self.pump(now)

    # -- inside ----------------------------------------------------------------------------
    def pump(self, now: float) -> list[Ticket]:
        """Admit waiting tickets, highest lane first, while they fit."""
        out: list[Ticket] = []
        for lane in self.order:
            q = self.queues[lane]
            while len(q):
                head = q.peek()
                assert head is not None
                if not self._fits(head, now):
                    break
                q.pop()
                self._grant(now, head)
                out.append(head)
            if len(q):
                break  # strict priority: a lower lane waits while a higher one waits
        return out

    def _grant(self, now: float, t: Ticket) -> None:
        t.state = "admitted"
        t.granted_at = now
        self.in_flight += 1
        self.in_flight_tokens += t.tokens
        self.lane_in_flight[t.lane] += 1
        self.lane_tokens[t.lane] += t.tokens
        self.granted[t.lane].record(now)

    def preempts(self, lane: str) -> bool:
        """``lane`` takes its slots from the lanes below it (a preemptive pool, not the lowest)."""
        return self.preemptive and lane != self.order[-1]

    def limit_for(self, lane: str) -> int | None:
        """The request limit ``lane`` counts against (None: no request limit)."""
        if self.max_requests is None:
            return None
        if self.preempts(lane) and self.preempt_limit is not None:
            return self.preempt_limit
        return self.max_requests

    def _held(self, lane: str) -> tuple[int, int]:
        """(slots, tokens) counted against ``lane``'s limit: all, or those at or above it."""
        if not self.preempts(lane):
            return self.in_flight, self.in_flight_tokens
        top = self.order[: self.order.index(lane) + 1]
        return sum(self.lane_in_flight[n] for n in top), sum(self.lane_tokens[n] for n in top)

    def _fits(self, t: Ticket, now: float) -> bool:
        limit = self.limit_for(t.lane)
        held, tokens = self._held(t.lane)
        if limit is not None:
            if held >= limit:
                return False
            cfg = self.lanes[t.lane]
            share = max(1, math.floor(limit * cfg.max_share))
            if self.lane_in_flight[t.lane] >= share:
                return False
            # an empty pool always starts its head: nothing in flight would wake it later
            reserved = self.reserved_above(now, t.lane) if held else 0
            if held + 1 + reserved > limit:
                return False
        if self.max_tokens is not None and held > 0:
            # a request larger than the whole budget still runs, alone
            return tokens + t.tokens <= self.max_tokens
        return True

    def reserved_above(self, now: float, lane: str) -> int:
        """Free slots ``lane`` leaves for the lanes above it: what each is measured to need
        (offered rate × hold time, times 1 + ``leave_for_higher``) beyond what it holds now;
        0 when the lane does not leave room (``leave_for_higher`` None) or nothing is measured."""
        headroom = self.lanes[lane].leave_for_higher
        if headroom is None or self.max_requests is None:
            return 0
        need = 0
        for name in self.order:
            if name == lane:
                break
            want = math.ceil(self.demand[name].slots(now) * (1.0 + headroom))
            need += max(0, want - self.lane_in_flight[name])
        return min(need, self.max_requests)

    def _waiting_above(self, lane: str) -> bool:
        return any(len(self.queues[name]) for name in self.order[: self.order.index(lane)])

    # -- predictions -----------------------------------------------------------------------
    def _ahead(self, lane: str, tenant: str, weight: float) -> int:
        ahead = 0
        for name in self.order:
            if name == lane:
                return ahead + self.queues[name].ahead_of_new(tenant, weight)
            ahead += len(self.queues[name])
        return ahead

    def drain_rate(self, now: float, lane: str) -> float | None:
        """Requests per second this lane's queue is measured to drain (grants to the lane;
        the pool's completions when the lane has none in the window)."""
        rate = self.granted[lane].rate(now)
        return rate if rate is not None else self.completed.rate(now)

    def room(self, now: float, lane: str) -> int | None:
        """Slots ``lane`` may hold in steady state: its share, less the slots it leaves for the
        lanes above (with ``leave_for_higher``: their need, as the last seconds measure it when
        that is more: the reserve follows a rising demand within its window); None without a
        request limit. Slots the lanes above hold beyond that come back to it as they end."""
        limit = self.limit_for(lane)
        if limit is None:
            return None
        cfg = self.lanes[lane]
        share = max(1, math.floor(limit * cfg.max_share))
        above = 0
        if cfg.leave_for_higher is not None:
            for name in self.order[: self.order.index(lane)]:
                above += math.ceil(self.demand[name].rising(now) * (1.0 + cfg.leave_for_higher))
        return max(0, min(share, limit - above))

    def outlook(self, now: float, lane: str) -> Outlook | None:
        """What holds ``lane``'s queue back now (:mod:`filters.admission.forecast`); None until
        the lane's hold time and the pool's completions are measured."""
        room = self.room(now, lane)
        hold = self.demand[lane].hold
        if room is None or hold is None or hold <= 0:
            return None
        pool = self.completed.rate(now)
        if pool is None and self.in_flight:
            pool = self.in_flight / hold
        if pool is None or pool <= 0:
            return None
        above = sum(len(self.queues[n]) for n in self.order[: self.order.index(lane)])
        return Outlook(room, self.lane_in_flight[lane], hold, pool, above)

    def predicted_wait(
        self,
        now: float,
        lane: str,
        tenant: str,
        weight: float,
        within: float = math.inf,
    ) -> float | None:
        """Seconds until a new ticket would start (``inf``: not while the lanes above need
        the room); from the measured drain rate while the outlook is not measured yet (None:
        nothing measured; the ticket may queue and its wait bound decides): its fair place and
        the clients due back before it could start (as many as lately do come back; counted
        only while the wait is ``within`` what the caller allows: past it, the answer is
        decided)."""
        outlook = self.outlook(now, lane)
        if outlook is not None:
            q = self.queues[lane]
            ahead, told, back = q.ahead_of_new(tenant, weight), self.told[lane], 0
            wait = outlook.wait(ahead)
            for _ in range(16):  # each client due back before its start pushes the start on
                if wait > within or not math.isfinite(wait):
                    break
                due = int(told.due(now, now + wait) * told.return_share + 0.5)
                if due <= back:
                    break
                back, wait = due, outlook.wait(ahead + due)
            return wait
        rate = self.drain_rate(now, lane)
        if rate is None or rate <= 0:
            return None
        return (self._ahead(lane, tenant, weight) + 1) / rate

    def retry_after(
        self,
        now: float,
        lane: str,
        *,
        extra: int = 0,
        key: Hashable | None = None,
        tenant: str | None = None,
    ) -> float:
        """When to come back, for a client shed now: the time the lane's queue (and the ones
        above it, or ``extra`` requests ahead) plus every client already told to come back
        take to start at the measured drain rate, stretched by up to ``JITTER`` (with an rng);
        the lane's longest wait when nothing was measured yet. A lane blocked by the lanes
        above (no room) is told no sooner than their measured need could fade, than the
        clients queued or told at or above it take at the pool's completion rate, and than its
        own queue and told clients take at the rate it lately started requests. The answer
        is remembered: the next client shed is told a later time, and a client with ``key``
        that comes back then goes first (:mod:`filters.admission.herd`) — while ``tenant``
        holds fewer such places in the lane than it may queue requests there."""
        outlook = self.outlook(now, lane)
        rate = self.drain_rate(now, lane)
        told = self.told[lane]
        queued = 0
        for name in self.order:
            queued += len(self.queues[name])
            if name == lane:
                break
        if outlook is not None and outlook.room <= 0:
            wait = self._blocked_wait(now, lane, outlook, max(extra, queued))
            if rate is not None and rate > 0:  # and no sooner than the lane lately started them
                wait = max(wait, (max(extra, queued) + told.outstanding(now) + 1) / rate)
        elif rate is None or rate <= 0:
            wait = max(self.lanes[lane].max_wait, 1.0)
        else:
            wait = (max(extra, queued) + told.outstanding(now) + 1) / rate
        if self.rng is not None:
            wait *= 1.0 + self.rng.uniform(0.0, JITTER)
        wait = min(MAX_RETRY_AFTER, wait)
        bound = self.lanes[lane].max_queue_per_tenant
        if key is not None and tenant is not None and told.held(tenant) >= bound:
            key = None  # no more promised places than queue places: it comes back fresh
        told.add(now + wait, wait, key, tenant)
        return wait

    def _blocked_wait(self, now: float, lane: str, outlook: Outlook, queued: int) -> float:
        above = self.order[: self.order.index(lane) + 1]
        promised = sum(self.told[n].outstanding(now) for n in above)
        drain = (queued + promised + 1) / outlook.pool_rate
        headroom = self.lanes[lane].leave_for_higher
        if headroom is None or self.max_requests is None:
            return drain
        want = sum(self.demand[n].slots(now) for n in above[:-1]) * (1.0 + headroom)
        free = self.max_requests - outlook.running - 1
        return max(drain, fade(self.demand[lane].offered.window, want, free))
