"""How many batch lines may be in flight now (pure; the clock is passed in).

The window is the room interactive traffic leaves in the pool, read from the pool state the
control plane publishes (every scrape interval, ~0.25 s):

* **others** = what the replicas run or queue that is not ours: ``running + queued`` minus our
  lines in flight. Our count is the largest it was over the last ``lag`` seconds, not the count
  now: the pool state is a sample taken up to ``lag`` ago, and lines that finished since are
  still in it. Subtracting today's (smaller) count would read our own finished lines as
  interactive work and leave their slots idle at every turnover;
* **room** = ``capacity - others``: the slots interactive traffic leaves idle;
* **headroom**: the interactive lane's rise. ``others`` is kept per sample over the last
  ``trend`` seconds; the largest rise between two samples there (at least one slot) is held
  free, so a burst that is arriving finds slots before its next requests queue, and the window
  shrinks as soon as interactive demand climbs, not after it has taken the slots;
* the first window is ``min(fill × room, room - headroom)``. From then on each new sample
  closes the loop on what the replicas report: the window moves by ``gain`` × (the occupancy
  aimed at − ``running + queued``), where the occupancy aimed at is the capacity less
  ``max(headroom, (1 - fill) × room)``. Lines in flight are not all in a slot: each spends part
  of its life in the gateway (its filters, admission, recording its result), and a window
  counted in lines in flight left those lines' share of the slots idle. An excess is cut at
  once, from our lines in flight as the sample saw them (the largest count over ``lag``; the
  same excess seen in two samples is not cut twice); a shortfall is made up by ``gain`` of it, only while the window binds (as
  many lines in flight as it allows) and at most once per ``lag`` (the last rise must show
  in the samples first): no wind-up either way;
* the occupancy aimed at holds at most ``max_share`` of the pool's running slots of ours
  (``lane_share``: the admission policy's share for the batch lane, default 0.9) beside the
  interactive work: admission lets the lane hold no more. Before this bound ``fill`` 0.95
  aimed past the lane's 0.9: the replicas never reached the aim, the window grew to ~75 lines
  for 57 admitted, and the lines past it waited in the gateway's queue, where the degradation
  ladder read them as the pool's overload (its level is the higher of the replicas'
  saturation and the gate's in-flight and queued requests against its limit): it went to
  its batch shed step, and 90 lines were shed in one run, each halving the limit and pausing
  new lines;
* all of it bounded by an additive-increase / multiplicative-decrease limit that the gateway's
  own answers drive: a line shed by admission or quota (429, 503) halves the limit and pauses
  new lines for ``backoff`` (or the answer's ``Retry-After``); each answered line raises it by
  one. The limit starts at ``max_concurrency``: the pool state already bounds the window, and
  a slow start only left idle slots for the first round trips.

Until interactive is quiet (no work seen for ``trend`` seconds and for ``ln 20 / λ`` at its
measured arrival rate ``λ``: stepguard.Quiet), the **step guard**
(``guard``, batch_service/stepguard.py) caps the batch streams: the occupancy aimed at is at
most ``interactive + cap``, where ``cap`` is how many batch streams the replicas may carry
before their measured decode step grows more than ``batch.runner.max_step_increase`` over the
step the interactive streams see alone. ``interactive`` is the replicas' ``running + queued``
less our lines *at the replicas*: our lines in flight less the share of them in the gateway,
read while interactive is idle (``others``, which subtracts every line in flight, hid up to
that many interactive requests beside a full batch). An excess is cut at once as above, so the
window falls to the cap with the first sample that shows interactive demand. Once interactive
is quiet the guard does not bind and the slots decide.

New lines start in bursts of at most an eighth of ``max_concurrency`` (at least 4), eight
bursts a second: a
window of 60 opened at once sent 60 requests into the filter server together, and on a loaded
machine a third of them waited past its ``message_timeout`` (504) and made the runner back off.

While the pool state is stale (the control plane is not heard), the reader reports every replica
saturated, so nothing new starts.
"""

from __future__ import annotations

import collections
import math
import statistics
from dataclasses import dataclass

from batch_service.stepguard import Quiet, StepGuard

__all__ = ["Pacer", "PoolView"]

LAG_S = 0.5  # how old a pool-state sample may be when it is read (scrape + publish)
TREND_S = 2.0  # how far back interactive demand's rise is looked at
GAIN = 0.5  # share of a shortfall in occupancy made up per rise (an excess is cut at once)
TRANSIT_SAMPLES = 16  # idle samples the share of our lines in the gateway is the median of
TRANSIT_MIN_LINES = 4  # fewer lines in flight say nothing about that share


@dataclass(frozen=True, slots=True)
class PoolView:
    capacity: int  # running slots of the pool's fresh replicas (0: unknown)
    running: int  # requests running there now, ours included
    saturation: float  # the pool's mean saturation (1 = every slot busy; stale = saturated)
    queued: int = 0  # requests waiting in the replicas' queues, ours included
    version: int = 0  # the pool state's version: a new one is a new sample
    endpoints: tuple[str, ...] = ()  # the fresh replicas (the step guard's per-replica cap)


class Pacer:
    def __init__(
        self,
        max_concurrency: int,
        fill: float,
        backoff: float,
        *,
        lag: float = LAG_S,
        trend: float = TREND_S,
        gain: float = GAIN,
        guard: StepGuard | None = None,
        lane_share: float = 1.0,
    ) -> None:
        self.max = max_concurrency
        self.lane_share = lane_share  # admission's ``max_share`` of the batch lane
        self.fill = fill
        self.backoff = backoff
        self.lag = lag
        self.trend = trend
        self.gain = gain
        self.guard = guard
        self.cap: int | None = None  # batch streams the step guard allows now (None: off)
        # interactive requests at the replicas: the guard's reading (our lines at the replicas
        # taken off), or ``others`` (all our lines taken off) where the guard reads nothing
        self.interactive = 0
        self._window: float | None = None  # the controlled window (None: no sample yet)
        self._raised_at = float("-inf")
        self._bucket = max(4.0, max_concurrency / 8)  # lines that may start now
        self._filled_at = 0.0
        self.limit = float(max_concurrency)  # the AIMD limit
        self.paused_until = 0.0
        self._ours: collections.deque[tuple[float, int]] = collections.deque()  # (t, in flight)
        self._others: collections.deque[tuple[float, int]] = collections.deque()  # per sample
        self._version: int | None = None
        # the step guard's view of interactive work: per sample, (t, interactive requests);
        # and the share of our lines in flight not at the replicas (in the gateway), read
        # while interactive is idle (all the replicas' work is ours then)
        self._quiet = Quiet(trend)
        self._steady: collections.deque[tuple[float, int]] = collections.deque()  # over trend
        self._transit: collections.deque[float] = collections.deque(maxlen=TRANSIT_SAMPLES)

    def window(self, pool: PoolView | None, ours: int, now: float, *, decodes: bool = True) -> int:
        """Lines that may be in flight at ``now`` with ``ours`` in flight (``pool`` None:
        no pool state at all yet: nothing). ``decodes``: the job's lines are decode streams
        (chat, completions); an embeddings job's are not (one prefill each), so the step
        guard, which bounds the decode step batch streams add, does not bind it (its
        unmeasured bound, ``⌊max_step_increase · i⌋`` streams, is 0 beside a few interactive
        requests, and no embeddings request ever gives a step to measure: the job stopped
        for as long as interactive requests kept coming)."""
        self._remember_ours(ours, now)
        if now < self.paused_until or pool is None:
            return 0
        if pool.capacity <= 0:  # stale or unknown replicas: the reader marks them saturated
            return 0 if pool.saturation >= 1.0 else min(int(self.limit), self.max)
        recent = max(n for _, n in self._ours)
        others = max(0, pool.running + pool.queued - recent)
        fresh = pool.version != self._version
        if fresh:  # a new sample: one point of the interactive trend
            self._version = pool.version
            self._others.append((now, others))
        while self._others and self._others[0][0] < now - self.trend:
            self._others.popleft()
        room = pool.capacity - others
        head = self.headroom()
        cap = self._cap(pool, recent, fresh, now, others)  # every job: it keeps the guard's view
        self.cap = cap if decodes else None
        admitted = math.floor(self.lane_share * pool.capacity)  # what admission lets us hold
        if self._window is None:
            self._window = float(min(math.floor(self.fill * room), room - head, admitted))
            if self.cap is not None:
                self._window = min(self._window, float(self.cap))
            self._raised_at = now
        elif fresh:
            aim = pool.capacity - max(head, math.ceil((1.0 - self.fill) * room))
            if self.cap is not None:  # the step guard: at most ``cap`` batch streams
                aim = min(aim, self.interactive + self.cap)
            # no more of ours at the replicas than admission lets the batch lane hold
            # (``max_share`` of the slots): a window aiming past it grew without ever
            # reaching its aim, and the lines past it waited in the gateway's queue, where
            # the degradation ladder read them as the pool's overload
            aim = min(aim, self.interactive + admitted)
            error = aim - (pool.running + pool.queued)
            if error < 0:  # at once, from our lines as the sample saw them (an excess seen
                self._window = min(self._window, recent + error)  # in two samples: cut once)
            elif ours >= self._window - 1 and now - self._raised_at >= self.lag:
                # grow while the window binds, once the last rise can show in the samples
                self._window += self.gain * error
                self._raised_at = now
        self._window = max(0.0, min(self._window, float(self.max)))
        return max(0, min(math.floor(self._window), int(self.limit), self.max))

    def _cap(self, pool: PoolView, recent: int, fresh: bool, now: float, others: int) -> int | None:
        """The step guard's bound on batch streams until interactive is quiet
        (:class:`~batch_service.stepguard.Quiet`: idle for ``trend`` and for ``ln 20 / λ``
        at its arrival rate ``λ``); None: no bound.

        Interactive work is read as the replicas' ``running + queued`` less our lines *at the
        replicas*: our lines in flight less the share of them that is in the gateway
        (filters, admission, recording results: ~1/6 of a full window, measured). With
        ``others`` (all our lines subtracted) a full batch hid up to that many interactive
        requests, and the guard let go while they ran. The share is the median of the last
        samples taken while interactive was quiet (then every request at the replicas is
        ours). Without a guard (or replicas to read) interactive is read as ``others``."""
        if self.guard is None or not pool.endpoints:
            self.interactive = others
            return None
        occupancy = pool.running + pool.queued
        share = statistics.median(self._transit) if self._transit else 0.0
        interactive = max(0, round(occupancy - (1.0 - share) * recent))
        self.interactive = interactive
        if fresh:
            self._quiet.observe(now, interactive)
        if self._quiet.quiet(now):
            # idle: what is not at the replicas, read while our lines in flight hold steady
            # (a window opening sends lines the sample cannot show yet: read then, the
            # share came out near 1 and every request at the replicas looked interactive)
            low = min(n for _, n in self._steady)
            spanned = self._steady[0][0] <= now - self.trend  # a whole ``trend`` seen
            steady = spanned and recent - low <= max(2, recent // 10)
            if fresh and recent >= TRANSIT_MIN_LINES and steady:
                self._transit.append(max(0.0, (recent - occupancy) / recent))
            return None  # interactive quiet: the slots decide
        return self.guard.cap(pool.endpoints, interactive)

    def at_replicas(self, ours: int) -> int:
        """Of ``ours`` lines in flight, those at the replicas, for the degradation ladder and
        the online planner (poolstate/valley.py): less the measured share in the gateway
        (none measured yet: all of them). The count now, not the fewest over the last
        ``lag`` that the pool-state sample may be: the published count reaches the ladder a
        publish and a read later (0.25 s each), and a lower one lagged a job's opening
        window by a second, long enough to read its lines as overload and clamp the free
        tier for the step's dwell (measured: one clamp at each job's start)."""
        share = statistics.median(self._transit) if self._transit else 0.0
        return max(0, math.floor((1.0 - share) * ours))

    def starts(self, now: float, want: int) -> int:
        """How many of ``want`` new lines may start at ``now`` (the start bucket; taken)."""
        burst = max(4.0, self.max / 8)
        rate = 8 * burst  # a burst every 1/8 s
        self._bucket = min(burst, self._bucket + (now - self._filled_at) * rate)
        self._filled_at = now
        n = max(0, min(want, math.floor(self._bucket)))
        self._bucket -= n
        return n

    def headroom(self) -> int:
        """Slots held free for interactive demand: its largest rise between two samples of
        the last ``trend`` seconds, at least one."""
        rise = 1
        prev: int | None = None
        for _, n in self._others:
            if prev is not None:
                rise = max(rise, n - prev)
            prev = n
        return rise

    def answered(self) -> None:
        self.limit = min(float(self.max), self.limit + 1.0)

    def shed(self, now: float, retry_after: float | None = None) -> None:
        self.limit = max(1.0, self.limit / 2.0)
        pause = self.backoff if retry_after is None else max(self.backoff, retry_after)
        self.paused_until = max(self.paused_until, now + pause)

    def _remember_ours(self, ours: int, now: float) -> None:
        self._steady.append((now, ours))  # kept back to the last entry at or before the span
        while len(self._steady) > 1 and self._steady[1][0] <= now - self.trend:
            self._steady.popleft()
        self._ours.append((now, ours))
        while len(self._ours) > 1 and self._ours[0][0] < now - self.lag:
            self._ours.popleft()
