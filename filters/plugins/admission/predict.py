"""What admission predicts, read off its state (:class:`filters.plugins.admission.core.Admission`
inherits it): the limit a lane counts against and the room it has, how fast its queue drains,
how long a new ticket would wait, and the ``Retry-After`` a shed client is told. Nothing here
changes the admission state, except that a told ``Retry-After`` is remembered
(:mod:`filters.plugins.admission.herd`). Pure: ``now`` is passed in.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable

from filters.plugins.admission.demand import Demand
from filters.plugins.admission.drain import DrainMeter
from filters.plugins.admission.forecast import Outlook, fade
from filters.plugins.admission.herd import Promises
from filters.plugins.admission.lanes import LaneConfig
from filters.plugins.admission.queues import LaneQueue

__all__ = ["JITTER", "MAX_RETRY_AFTER", "Predictions"]

MAX_RETRY_AFTER = 300.0  # seconds; Envoy's rate_limited_retry_back_off reads at most this
_PHI = (math.sqrt(5.0) - 1.0) / 2.0  # spreads the told waits when nothing is measured
JITTER = 0.1  # a told wait is stretched by up to this share (with an rng), so returns spread


class Predictions:
    """The predictions; the state they read is :class:`~filters.plugins.admission.core.Admission`'s."""

    lanes: dict[str, LaneConfig]
    order: tuple[str, ...]
    queues: dict[str, LaneQueue]
    max_requests: int | None
    in_flight: int
    in_flight_since: float  # the running tickets' grant instants, summed
    lane_in_flight: dict[str, int]
    preemptive: bool  # the backends preempt lower-priority running requests
    preempt_limit: int | None  # the lanes that preempt count to this (None: max_requests)
    granted: dict[str, DrainMeter]
    completed: DrainMeter
    demand: dict[str, Demand]
    told: dict[str, Promises]
    rng: random.Random | None

    # -- limits ----------------------------------------------------------------------------
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
        """What holds ``lane``'s queue back now (:mod:`filters.plugins.admission.forecast`); None until
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
        take to start at the measured drain rate (no slower than the lane's room over its hold
        time: what it starts once full), stretched by up to ``JITTER`` (with an rng);
        when nothing was measured yet (no request of the pool has ended: a burst's first grants
        into free slots are no drain rate), twice the running requests' mean age (within 1 s and
        the lane's longest wait) for as many clients as the lane holds at once and the later ones
        spread evenly up to twice it (a burst shed before anything was measured does not come
        back as one herd, nor long after the pool idles; its returns are measured by then). A
        lane blocked by the lanes above (no room) is told no sooner than their measured need
        could fade, than the clients queued or told at or above it take at the pool's
        completion rate, and than its own queue and told clients take at the rate it lately
        started requests. The answer
        is remembered: the next client shed is told a later time, and a client with ``key``
        that comes back then goes first (:mod:`filters.plugins.admission.herd`) — while ``tenant``
        holds fewer such places in the lane than it may queue requests there."""
        outlook = self.outlook(now, lane)
        # until the pool has ended requests, grants went into free slots at once: a burst's
        # first grants, 40/s over its first 50 ms, are no drain rate (its clients were told
        # 0.7-1.4 s, a third of them within one quarter second); nothing is measured yet
        ended = self.completed.rate(now) is not None
        rate = self.drain_rate(now, lane) if ended else None
        if outlook is not None and outlook.room > 0:
            # no slower than the lane drains once it is full (room / hold): a grant rate
            # measured under a light load tells what the lane was asked, not what it can
            # start, and would send a storm's clients back long after the pool idles
            rate = max(rate or 0.0, outlook.rate)
        told = self.told[lane]
        queued = 0
        for name in self.order:
            queued += len(self.queues[name])
            if name == lane:
                break
        ahead = max(extra, queued)
        paced = (ahead + told.outstanding(now) + 1) / rate if rate else None  # the lane's pace
        if outlook is not None and outlook.room <= 0:
            wait = self._blocked_wait(now, lane, outlook, ahead)
            if paced is not None:  # and no sooner than the lane lately started them
                wait = max(wait, paced)
        elif paced is not None:
            wait = paced
        else:  # nothing measured: as long again as the running requests have run (no
            # sooner than 1 s, no later than the lane's longest wait) for as many as the lane
            # holds at once, the later ones spread evenly over as long again, whatever their
            # number (a golden-ratio sequence: every prefix of it covers the interval evenly)
            base = self._unmeasured_wait(now, lane)
            room = max(1, self.room(now, lane) or 1)
            n = ahead + told.outstanding(now)
            wait = base if n < room else base * (1.0 + math.fmod((n - room + 1) * _PHI, 1.0))
        if self.rng is not None:
            wait *= 1.0 + self.rng.uniform(0.0, JITTER)
        wait = min(MAX_RETRY_AFTER, wait)
        bound = self.lanes[lane].max_queue_per_tenant
        if key is not None and tenant is not None and told.held(tenant) >= bound:
            key = None  # no more promised places than queue places: it comes back fresh
        told.add(now + wait, wait, key, tenant)
        return wait

    def _unmeasured_wait(self, now: float, lane: str) -> float:
        """A shed client's wait before any request of the pool has ended: twice the mean age
        of the running requests (a request that has run ``a`` seconds is as likely to run ``a``
        more as to end sooner), within [1 s, the lane's ``max_wait``]. A storm's first clients
        are told about a second (its returns are measured by then), and while the requests run
        on unended, each new answer is later: a back-off that follows what it sees. With none
        running here either (shed on the pool state's word alone), nothing here will be
        measured soon: the lane's ``max_wait``."""
        longest = max(1.0, self.lanes[lane].max_wait)
        if not self.in_flight:
            return longest
        age = now - self.in_flight_since / self.in_flight
        return max(1.0, min(longest, 2.0 * age))

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
