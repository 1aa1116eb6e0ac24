"""Priority admission for one pool, pure: bounded lane queues released as capacity frees.

* Lanes are in strict priority order (interactive before batch): a freed slot goes to the
  highest lane with a waiting ticket that fits; a lower lane never overtakes a higher one.
* Inside a lane, tenants share by weight (:class:`~filters.plugins.admission.queues.LaneQueue`).
* Capacity: in-flight requests (and, when declared, in-flight tokens) against the pool's
  limit; each lane may hold at most ``max_share`` of the running slots, and a lane with
  ``leave_for_higher`` leaves free the slots the lanes above it are measured to need (their
  offered rate × hold time, plus that headroom: :mod:`filters.plugins.admission.demand`).
* Each lane's queue has a bound, a per-tenant bound and a longest wait. A ticket that cannot
  start in time is shed at once: queue full, or its predicted wait is longer than it may wait.
  The wait is predicted from what holds the pool now (:mod:`filters.plugins.admission.forecast`: the
  lane's room under the lanes above and their reserve, its hold time, the pool's completions),
  not from the lane's grant rate alone, which is measured over a window and lags. A queued
  ticket whose predicted start has moved past its wait budget is shed then (:meth:`sweep`,
  ``fell_behind``), not when the budget is gone; ``timed_out`` stays the last resort (and the
  only one for a client back when told: it waits its wait out for the place it was promised).
  ``Retry-After`` comes from the lane's measured drain rate; a lane blocked by the lanes above
  is told no sooner than their need could fade, nor than its own measured starts allow.
* A ``Retry-After`` is a promise (:mod:`filters.plugins.admission.herd`): a client that comes back
  when told (its ``key``) goes before the fresh tickets of its lane, and fresh tickets count the
  clients due back before they could start.
* Demand refused before the queue (the degradation ladder's shed step, :mod:`filters.plugins.degrade`) is
  still demand: :meth:`Admission.turn_away` counts each fresh request refused so (not a client
  already told to come back: it was counted when first refused), and :meth:`refused_slots` is
  the slots that demand would hold if admitted (its rate over the last ``RECENT`` seconds times
  the lane's hold time), which the ladder reads beside the slots taken and the queues.
* Preemptive pools (``preemptive``: the backends schedule by request priority and preempt a
  running lower-priority request for a higher one, SGLang's ``--enable-priority-scheduling``):
  a lane above the lowest counts only the slots its own and the higher lanes hold against the
  pool's declared limit (``preempt_limit``, not lowered by saturation: the backends' queues then
  hold the preempted lower-lane requests), so a batch burst never makes interactive wait. The
  lowest lane still counts every slot against the limit as lowered by saturation.

Every method takes ``now`` (the caller's clock); nothing here sleeps or does I/O. What is
predicted from this state (waits, drain rates, ``Retry-After``) is in :mod:`.predict`.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from filters.plugins.admission.demand import RECENT, Demand
from filters.plugins.admission.drain import DrainMeter
from filters.plugins.admission.herd import Promises
from filters.plugins.admission.lanes import LaneConfig
from filters.plugins.admission.predict import Predictions
from filters.plugins.admission.queues import LaneQueue, Ticket

__all__ = ["Admission", "LaneConfig", "Shed"]


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


class Admission(Predictions):
    """Lanes (highest priority first) in front of one pool's capacity (its predictions:
    :class:`~filters.plugins.admission.predict.Predictions`)."""

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
        self.in_flight_since = 0.0  # the running tickets' grant instants, summed (their age)
        self.in_flight_tokens = 0
        self.lane_in_flight = dict.fromkeys(self.order, 0)
        self.lane_tokens = dict.fromkeys(self.order, 0)
        self.preemptive = False  # the backends preempt lower-priority running requests
        self.preempt_limit: int | None = None  # the lanes that preempt count to this (None: max)
        self.granted = {c.name: DrainMeter(window) for c in lanes}
        self.completed = DrainMeter(window)
        self.demand = {c.name: Demand(window) for c in lanes}
        self.told = {c.name: Promises() for c in lanes}
        self.refused = {c.name: DrainMeter(RECENT) for c in lanes}  # fresh, turned away
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
        returned: bool = False,
    ) -> Ticket | Shed:
        """A new request: admitted (``state == "admitted"``), queued, or shed at once. ``key``
        recognises a client that comes back when its ``Retry-After`` said (:mod:`.herd`);
        ``returned``: another filter process told it so (:mod:`.shared`), it comes back now."""
        cfg = self.lanes[lane]
        self.demand[lane].offer(now)
        if deadline is not None and deadline <= now:
            return Shed(504, "deadline", self.retry_after(now, lane))
        back = returned or (key is not None and self.told[lane].claim(now, key))
        start_by = now + cfg.max_wait
        if deadline is not None:
            start_by = min(start_by, deadline)
        t = Ticket(
            next(self._seq), lane, tenant, weight, tokens, now, start_by, deadline,
            key=key, returning=back,
        )  # fmt: skip
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

    def starts_at_once(self, now: float, lane: str, tokens: int = 0) -> bool:
        """Whether a fresh request of ``lane`` would be admitted now (nothing changes)."""
        if self._waiting_above(lane) or len(self.queues[lane]):
            return False
        probe = Ticket(-1, lane, "", 1.0, tokens, now, now, None)
        return self._fits(probe, now)

    def release(self, now: float, ticket: Ticket, settled: float | None = None) -> list[Ticket]:
        """An admitted request ended (or was aborted); returns the tickets now admitted.
        ``settled``: the tokens its usage settled, when known here (else :meth:`settle`)."""
        if ticket.state == "queued":  # a new head may fit where the old one did not
            self.queues[ticket.lane].remove(ticket)
            ticket.state = "dropped"
            return self.pump(now)
        if ticket.state != "admitted":
            return []
        ticket.state = "done"
        self.queues[ticket.lane].ledger.end(ticket.tenant, ticket.charge, now, settled)
        self.in_flight -= 1
        self.in_flight_since = self.in_flight_since - ticket.granted_at if self.in_flight else 0.0
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

    def turn_away(self, now: float, lane: str, key: Hashable | None) -> bool:
        """A request of ``lane`` refused before it could queue (the ladder's shed): counted as
        offered demand when it is fresh, i.e. ``key`` holds no promise yet (a client told
        before and back, early or on time, is the same demand again). Returns whether counted.
        Call it before telling the client its ``Retry-After`` (which makes the promise)."""
        if key is not None and self.told[lane].knows(key):
            return False
        self.demand[lane].offer(now)
        self.refused[lane].record(now)
        return True

    def refused_slots(self, now: float) -> float:
        """Slots the fresh requests refused before the queue would hold, if admitted: per lane,
        their rate over the last ``RECENT`` seconds times the lane's hold time (each refused
        request counts one slot while no hold time is measured)."""
        total = 0.0
        for lane, meter in self.refused.items():
            rate = meter.rate(now)
            if rate is None:
                continue
            hold = self.demand[lane].hold
            total += rate * (hold if hold is not None and hold > 0 else meter.window)
        return total

    def clear_refused(self) -> None:
        """Forget the refused demand (the ladder stopped refusing: what comes now is admitted,
        queued or shed by admission itself, and counted there)."""
        for lane in self.refused:
            self.refused[lane] = DrainMeter(RECENT)

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

    def settle(
        self, now: float, lane: str, tenant: str, tokens: float, *, local: bool = True,
        requests: int = 1,
    ) -> None:  # fmt: skip
        """``tenant``'s ``requests`` of ``lane`` settled ``tokens`` (the usage meter);
        ``local`` False: other filter processes' (:mod:`.fairshare`)."""
        q = self.queues.get(lane)
        if q is not None:
            q.ledger.settle(tenant, tokens, now, local=local, requests=requests)

    def _grant(self, now: float, t: Ticket) -> None:
        t.charge = self.queues[t.lane].ledger.start(t.tenant, t.weight, t.tokens)
        t.state = "admitted"
        t.granted_at = now
        self.in_flight += 1
        self.in_flight_since += now
        self.in_flight_tokens += t.tokens
        self.lane_in_flight[t.lane] += 1
        self.lane_tokens[t.lane] += t.tokens
        self.granted[t.lane].record(now)

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
