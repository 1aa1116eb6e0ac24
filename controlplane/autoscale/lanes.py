"""Pure: a pool's arrivals split by lane, and the replicas each lane needs for its own budget.

**The split.** Replicas do not know lanes; admission does. The dashboard's collector already
sums every filter process's ``tokenweir_admission_admitted_total`` and
``tokenweir_admission_shed_total`` by (pool, lane) each round; a request that reached admission
was either admitted or shed, so their sum counts arrivals by lane. :class:`LaneWindow` keeps
those totals over the demand window and gives each lane's share of the window's arrivals; the
planner applies the shares to the pool's own arrival rate (measured at the replicas, forecast
on its trend). A pool that admission does not see (no counters, or none in the window) is one
interactive lane, as before.

**The need per lane.** Interactive is served first, batch takes what is left (strict
priority, as admission and the circuit breakers do). A lane's p95 wait is the FCFS wait of
the whole pool at the total rate (the planner's batch-aware model) scaled by Cobham's factor
``(1 − ρ) / ((1 − σ_{k−1})(1 − σ_k))`` — the offline planner's lane waits
(``controlplane/planner/limits.py``) — with σ_k the utilization of lane k and the lanes before
it. Each lane needs the smallest N whose wait fits its budget minus the TTFT floor; with one
interactive lane the factor is 1 and this is the planner's own wait count.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from controlplane.planner import PlanInputs
from controlplane.planner.capacity import Capacity, wait_estimate
from controlplane.planner.inputs import LANES, Lane

__all__ = [
    "LaneDemand",
    "LaneWindow",
    "lane_wait_fits",
    "ordered",
    "replicas_for_lane",
    "without_runners",
]

_MAX_SEARCH = 10_000


@dataclass(frozen=True, slots=True)
class LaneDemand:
    """One lane of a pool: its share of the arrivals and its TTFT budget."""

    lane: Lane
    share: float
    ttft_s: float


class LaneWindow:
    """Cumulative arrivals by lane of one pool (admitted + shed), kept for ``window_s``."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._points: deque[tuple[float, dict[str, float]]] = deque()

    def observe(self, now: float, arrivals: Mapping[str, float]) -> None:
        """Totals by lane summed over the filter processes that answered this round."""
        self._points.append((now, dict(arrivals)))
        while len(self._points) > 2 and self._points[1][0] <= now - self.window_s:
            self._points.popleft()

    def shares(self) -> dict[str, float]:
        """Each lane's share of the window's arrivals; empty when none were counted. A lane
        whose total fell (a filter process restarted or left) counts from its new total."""
        if len(self._points) < 2:
            return {}
        (_, old), (_, new) = self._points[0], self._points[-1]
        delta = {lane: max(v - old.get(lane, 0.0), 0.0) for lane, v in new.items()}
        total = sum(delta.values())
        if total <= 0:
            return {}
        return {lane: v / total for lane, v in delta.items() if v > 0}


def lane_wait_fits(
    inputs: PlanInputs, cap: Capacity, n: int, lanes: tuple[LaneDemand, ...], k: int
) -> bool:
    """Whether lane ``k``'s p95 wait on ``n`` replicas fits its budget minus the TTFT floor
    (ρ counts every lane's load, σ lane ``k``'s and those before it)."""
    lam = inputs.total_qps
    per = lam / (n * cap.rate("batch"))
    rho = per
    sigma_prev = sum(ld.share for ld in lanes[:k]) * per
    sigma = sigma_prev + lanes[k].share * per
    if rho >= 1 or sigma >= 1:
        return False
    fcfs = wait_estimate(inputs, cap, lam / n, "batch").quantile_s
    scale = (1 - rho) / ((1 - sigma_prev) * (1 - sigma))
    return fcfs * scale <= lanes[k].ttft_s - cap.ttft_floor_s


def replicas_for_lane(
    inputs: PlanInputs, cap: Capacity, lanes: tuple[LaneDemand, ...], k: int
) -> int | None:
    """Smallest N whose lane ``k`` wait fits its budget (doubling, then bisection); None when
    no count up to 10,000 does (or its budget is below the TTFT floor)."""
    if lanes[k].ttft_s <= cap.ttft_floor_s:
        return None

    def fits(n: int) -> bool:
        return lane_wait_fits(inputs, cap, n, lanes, k)

    lo = max(1, math.floor(inputs.total_qps / cap.rate("batch")) + 1)
    if fits(lo):
        return lo
    hi = lo
    while not fits(hi):
        if hi >= _MAX_SEARCH:
            return None
        lo, hi = hi, min(hi * 2, _MAX_SEARCH)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def without_runners(shares: Mapping[str, float], runner_share: float) -> dict[str, float]:
    """The lanes' shares without the batch runners' lines (poolstate/valley.py): admission
    counts them in the batch lane, and ``runner_share`` of the pool's arrivals were theirs
    (:attr:`~controlplane.autoscale.demand.Demand.runner_share`); the rest is renormalised by
    :func:`ordered`. Without them a job filling the valleys made most of a pool's arrivals
    batch, and the interactive lane was planned for a sliver of the rate left."""
    if runner_share <= 0:
        return dict(shares)
    out = {lane: max(0.0, s - runner_share) if lane == "batch" else s for lane, s in shares.items()}
    return {lane: s for lane, s in out.items() if s > 0}


def ordered(shares: Mapping[str, float], budgets: Mapping[str, float]) -> tuple[LaneDemand, ...]:
    """The lanes with arrivals in priority order (interactive first); one interactive lane of
    share 1 when there are none."""
    out = tuple(
        LaneDemand(lane, shares[lane], budgets[lane])
        for lane in LANES
        if shares.get(lane, 0.0) > 0 and lane in budgets
    )
    total = sum(ld.share for ld in out)
    if total <= 0:
        return (LaneDemand("interactive", 1.0, budgets["interactive"]),)
    return tuple(LaneDemand(ld.lane, ld.share / total, ld.ttft_s) for ld in out)
