"""Pure: a pool's live demand from its replicas' counters, over a sliding window.

Arrivals are counted as ``Δfinished + Δin-flight`` per replica (a request that arrived is either
done or still running or queued), so the rate does not lag by a service time. Prompt and output
means are ``Δprompt / Δarrivals`` and ``Δgenerated / max(Δfinished, Δarrivals)`` (generated
tokens include those of requests still in flight); the cache hit ratio is
``Δcached / Δprompt``. A replica seen for the first time, or whose counters went down (it
restarted), adds nothing that round. The trend is the rate of the window's newer half minus the
rate of its older half, over the time between their midpoints (req/s per s), once the window
is full, and only by what exceeds two standard deviations of Poisson noise in the two counts (at
a few requests per second a constant rate otherwise reads as ramps of ±50%). Until a request has finished, the token means are unknown (``measured`` False) and the
planner sizes the pool by the requests in flight alone.

**A batch runner's lines are not demand** (poolstate/valley.py): a job fills whatever slots it
finds, so planned for, its lines asked for replicas no interactive request needed (and a
replica added is more slots for the job to fill). The runners' words (their lines at the replicas, and the lines the pool
answered them with their tokens, cumulative) are counted the same way as a replica's counters
and taken off: arrivals ``Δanswered + Δlines``, finished, prompt and generated tokens, and the
requests in flight. Each total is the replicas' less the runners' (never below what it was: a
runner's word and a replica's page are read at different moments, and a round in which the
runner is ahead must not count as arrivals twice later).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from poolstate.counters import ReplicaCounters
from poolstate.valley import RunnerWord

__all__ = ["DEFAULT_OUTPUT", "DEFAULT_PROMPT", "Demand", "DemandWindow"]

DEFAULT_PROMPT = 1024.0  # tokens, until the pool has served a request
DEFAULT_OUTPUT = 256.0
_Z_TREND = 2.0  # a trend must exceed two standard deviations of Poisson noise


@dataclass(frozen=True, slots=True)
class Demand:
    """What the pool is asked for now."""

    arrival_rps: float = 0.0
    trend_rps_per_s: float = 0.0
    prompt_mean: float = DEFAULT_PROMPT
    output_mean: float = DEFAULT_OUTPUT
    hit_rate: float = 0.0
    inflight: float = 0.0
    span_s: float = 0.0  # how much history the numbers rest on
    measured: bool = False  # a request has finished: the token means are the pool's own
    # the share of the replicas' arrivals over the window that were batch runners' lines
    # (left out of ``arrival_rps``; admission counts them in the batch lane: lanes.py)
    runner_share: float = 0.0

    def forecast_rps(self, horizon_s: float) -> float:
        """The arrival rate ``horizon_s`` ahead on the trend; never below the rate now (a
        falling trend lowers the count through the scale-down window, not by guessing)."""
        return max(self.arrival_rps, self.arrival_rps + self.trend_rps_per_s * horizon_s)


@dataclass(frozen=True, slots=True)
class _Point:
    t: float
    arrivals: float
    finished: float
    prompt: float
    generated: float
    cached: float
    raw: float = 0.0  # the replicas' own arrivals, the runners' lines included


class DemandWindow:
    """Cumulative pool totals at each observation, kept for ``window_s``."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._last: dict[str, ReplicaCounters] = {}
        self._points: deque[_Point] = deque()
        self._totals = _Point(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)  # the replicas' less the runners'
        self._raw = self._totals  # the replicas' own
        self._runners_last: dict[str, RunnerWord] = {}
        self._runners = self._totals  # the batch runners' lines (poolstate/valley.py)
        self._inflight = 0.0
        self._prompt_mean = DEFAULT_PROMPT
        self._output_mean = DEFAULT_OUTPUT
        self._hit = 0.0
        self._measured = False

    def observe(
        self,
        now: float,
        replicas: Mapping[str, ReplicaCounters],
        runners: Mapping[str, RunnerWord] | None = None,
    ) -> None:
        """Add one round of the pool's replicas' counters (only those that answered), less the
        batch runners' lines on the pool (``runners``: each fresh runner replica's word)."""
        a = f = p = g = c = 0.0
        for ep, cur in replicas.items():
            prev = self._last.get(ep)
            if prev is None or cur.finished < prev.finished or cur.prompt < prev.prompt:
                continue  # first sight, or restarted: no delta this round
            a += (cur.finished - prev.finished) + (cur.inflight - prev.inflight)
            f += cur.finished - prev.finished
            p += cur.prompt - prev.prompt
            g += cur.generated - prev.generated
            c += max(cur.cached - prev.cached, 0.0)
        # a replica that stopped answering keeps its last counters: if it comes back with the
        # same process its deltas are right; if not, the decrease check above skips it
        self._last.update(replicas)
        words = runners or {}
        lines = sum(w.lines for w in words.values())
        self._inflight = max(0.0, sum(r.inflight for r in replicas.values()) - lines)
        r = self._raw
        self._raw = _Point(
            now, r.arrivals + max(a, 0.0), r.finished + f, r.prompt + p, r.generated + g,
            r.cached + c,
        )  # fmt: skip
        self._runners = self._runner_totals(now, words)
        raw, ours, t = self._raw, self._runners, self._totals
        self._totals = _Point(
            now,
            max(t.arrivals, raw.arrivals - ours.arrivals),
            max(t.finished, raw.finished - ours.finished),
            max(t.prompt, raw.prompt - ours.prompt),
            max(t.generated, raw.generated - ours.generated),
            raw.cached,  # the runners' cached tokens are not known: the hit rate is the pool's
            raw.arrivals,
        )
        self._points.append(self._totals)
        while len(self._points) > 2 and self._points[1].t <= now - self.window_s:
            self._points.popleft()

    def _runner_totals(self, now: float, words: Mapping[str, RunnerWord]) -> _Point:
        """The runners' cumulative lines, as a replica's: arrivals ``Δanswered + Δlines``
        (a runner seen first, or restarted, adds nothing that round; one not heard keeps its
        last word)."""
        a = f = p = g = 0.0
        for name, cur in words.items():
            prev = self._runners_last.get(name)
            if prev is None or cur.answered < prev.answered or cur.prompt < prev.prompt:
                continue
            a += (cur.answered - prev.answered) + (cur.lines - prev.lines)
            f += cur.answered - prev.answered
            p += cur.prompt - prev.prompt
            g += cur.generated - prev.generated
        self._runners_last.update(words)
        t = self._runners
        # not clamped per round: the lines at the replicas are an estimate that moves both
        # ways, and over a window their changes cancel (the net totals are kept monotone)
        return _Point(now, t.arrivals + a, t.finished + f, t.prompt + p,
                      t.generated + g, 0.0)  # fmt: skip

    def forget(self, endpoints: set[str]) -> None:
        """Drop replicas no longer in the pool."""
        for ep in set(self._last) - endpoints:
            del self._last[ep]

    def demand(self) -> Demand:
        pts = self._points
        if len(pts) < 2:
            return Demand(inflight=self._inflight)
        first, last = pts[0], pts[-1]
        span = last.t - first.t
        if span <= 0:
            return Demand(inflight=self._inflight)
        arrivals = last.arrivals - first.arrivals
        finished = last.finished - first.finished
        prompt = last.prompt - first.prompt
        if arrivals > 0 and prompt > 0:
            self._prompt_mean = prompt / arrivals
        if finished > 0:
            # generated tokens include those of requests still in flight: per finished request
            # that overstates the mean while the in-flight count grows (a ramp, the start), per
            # arrival it understates it while it shrinks; the larger count bounds both biases
            per = max(finished, arrivals)
            self._output_mean = max((last.generated - first.generated) / per, 1.0)
            self._measured = True
        if prompt > 0:
            self._hit = min(max((last.cached - first.cached) / prompt, 0.0), 0.99)
        raw = last.raw - first.raw
        return Demand(
            runner_share=min(max(1.0 - arrivals / raw, 0.0), 1.0) if raw > 0 else 0.0,
            arrival_rps=arrivals / span,
            trend_rps_per_s=self._trend(),
            prompt_mean=self._prompt_mean,
            output_mean=self._output_mean,
            hit_rate=self._hit,
            inflight=self._inflight,
            span_s=span,
            measured=self._measured,
        )

    def _trend(self) -> float:
        pts = list(self._points)
        if len(pts) < 4 or pts[-1].t - pts[0].t < 0.9 * self.window_s:
            return 0.0  # a trend rests on a full window
        mid = len(pts) // 2
        old, new = pts[: mid + 1], pts[mid:]
        dt_old, dt_new = old[-1].t - old[0].t, new[-1].t - new[0].t
        if dt_old <= 0 or dt_new <= 0:
            return 0.0
        n_old = old[-1].arrivals - old[0].arrivals
        n_new = new[-1].arrivals - new[0].arrivals
        gap = (new[0].t + new[-1].t) / 2 - (old[0].t + old[-1].t) / 2
        if gap <= 0:
            return 0.0
        # Poisson counts differ by about √(n_old + n_new) with no trend at all: only the excess
        # over two of those (rescaled to the newer half's span) is taken as a trend
        diff = n_new - n_old * dt_new / dt_old
        noise = _Z_TREND * math.sqrt(n_old + n_new)
        excess = math.copysign(max(abs(diff) - noise, 0.0), diff)
        return excess / dt_new / gap
