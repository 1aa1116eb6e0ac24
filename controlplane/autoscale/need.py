"""Pure: the replicas a pool needs for a demand, by the capacity planner's model.

The planner (controlplane/planner) is run as ``tokenweir plan`` runs it, with the live demand as
its inputs: one traffic class at the forecast arrival rate, the measured prompt and output means
(p95 taken as 3× the mean, an exponential tail, since counters carry no distribution), the
measured cache hit ratio, the replica's profile folded at this workload's context and scaled by
the pool's measured decode and prefill factors (rates.py; the emulator's time scale until
measured), the interactive lane's TTFT budget and the pool's TBT budget, and a
target utilization of ``1 / (1 + headroom)``. The binding reason is ``ttft`` when the wait budget
needs more replicas than the utilization target, else what bounds a replica's batch (``tbt``,
``kv``, ``slots`` for max_running_requests). The requests in flight set a floor too
(``⌈in-flight / c⌉``, reason ``ttft``): a queue that already formed is served now.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from controlplane.planner import (
    InfeasibleError,
    PlanInputError,
    PlanInputs,
    ReplicaModel,
    TokenDist,
    TrafficClass,
    for_workload,
)
from controlplane.planner.capacity import replica_capacity

from .demand import Demand
from .lanes import LaneDemand, replicas_for_lane

__all__ = ["Need", "TimeScaled", "replicas_for"]

P95_OVER_MEAN = 3.0
_BINDING = {"TBT budget": "tbt", "KV cache": "kv", "max_running_requests": "slots"}


@dataclass(frozen=True)
class TimeScaled:
    """``inner`` with every step time multiplied by ``k`` (the emulator's ``--time-scale``, or a
    replica's measured decode factor) and prefill time by ``k_prefill`` (default ``k``)."""

    inner: ReplicaModel
    k: float
    k_prefill: float | None = None
    slots: int | None = None  # the pool's declared max_running_requests, where lower

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def prefill_tok_s(self) -> float:
        return self.inner.prefill_tok_s / (self.k if self.k_prefill is None else self.k_prefill)

    @property
    def step_overhead_s(self) -> float:
        return self.inner.step_overhead_s * self.k

    @property
    def max_running_requests(self) -> int:
        own = self.inner.max_running_requests
        return own if self.slots is None else min(own, self.slots)

    @property
    def max_total_tokens(self) -> int:
        return self.inner.max_total_tokens

    def itl_s(self, batch: int) -> float:
        return self.inner.itl_s(batch) * self.k

    def max_concurrency_for_tbt(self, tbt_s: float) -> int:
        return self.inner.max_concurrency_for_tbt(tbt_s / self.k)


@dataclass(frozen=True, slots=True)
class Need:
    """Replicas the demand needs (before bounds and damping), why, and the per-replica slots."""

    replicas: int
    reason: str
    slots: int = 0
    note: str = ""
    lanes: tuple[tuple[str, int], ...] = ()  # (lane, replicas its own TTFT budget needs)


def replicas_for(
    demand: Demand,
    rate_rps: float,
    replica: ReplicaModel,
    *,
    ttft_s: float,
    tbt_s: float,
    headroom: float,
    time_scale: float = 1.0,
    prefill_scale: float | None = None,
    lanes: tuple[LaneDemand, ...] = (),
    slots: int | None = None,
) -> Need:
    """Replicas for ``rate_rps`` arrivals of ``demand``'s shape (see the module docstring);
    ``time_scale`` multiplies the profile's step times and ``prefill_scale`` (default the same)
    its prefill time: the emulator's time scale, or the pool's measured factors (rates.py).
    ``lanes`` split the arrivals, each with its own TTFT budget (lanes.py); none: one
    interactive lane with budget ``ttft_s``. ``slots``: the pool's declared
    ``capacity.max_running_requests`` (its replicas run no larger batch)."""
    folded, _ = for_workload(replica, demand.prompt_mean, demand.output_mean, demand.hit_rate)
    scaled = time_scale != 1.0 or (prefill_scale is not None and prefill_scale != 1.0)
    capped = slots is not None and slots < folded.max_running_requests
    model: ReplicaModel = (
        TimeScaled(folded, time_scale, prefill_scale, slots) if scaled or capped else folded
    )
    util = min(1.0 / (1.0 + headroom), 0.99)
    lanes = lanes or (LaneDemand("interactive", 1.0, ttft_s),)
    rate = max(rate_rps, 1e-9)
    try:
        inputs = PlanInputs(
            replica=model,
            prompt=TokenDist(
                demand.prompt_mean, demand.prompt_mean * P95_OVER_MEAN, None, "prompt"
            ),
            output=TokenDist(
                demand.output_mean, demand.output_mean * P95_OVER_MEAN, None, "output"
            ),
            ttft_s=min(ld.ttft_s for ld in lanes),
            tbt_s=tbt_s,
            classes=tuple(
                TrafficClass(ld.lane, rate * ld.share, ld.lane, ld.ttft_s) for ld in lanes
            ),
            target_utilization=util,
            prefix_hit_rate=demand.hit_rate,
        )
        cap = replica_capacity(inputs)
    except (InfeasibleError, PlanInputError) as exc:
        return Need(0, "infeasible", 0, str(exc))
    floor = math.ceil(demand.inflight / cap.c - 1e-9) if demand.inflight > 0 else 0
    if rate_rps <= 0 or not demand.measured:  # no load, or no finished request to size it by
        return Need(floor, "ttft" if floor else "idle", cap.c)
    n_util = max(1, math.ceil(inputs.total_qps / (cap.rate("batch") * util) - 1e-9))
    per_lane: list[tuple[str, int]] = []
    for k, ld in enumerate(lanes):
        n_k = replicas_for_lane(inputs, cap, lanes, k)
        if n_k is None:
            note = f"{ld.lane}: no replica count meets its p95 wait within its TTFT budget"
            return Need(max(floor, 1), _ttft_reason(ld.lane), cap.c, note)
        per_lane.append((ld.lane, n_k))
    lane, n_lat = max(per_lane, key=lambda x: x[1])
    n = max(n_util, n_lat)
    reason = _ttft_reason(lane) if n_lat > n_util else _BINDING.get(cap.binding, "tbt")
    if floor > n:
        note = f"{demand.inflight:g} in flight / c = {cap.c}"
        return Need(floor, "ttft", cap.c, note, tuple(per_lane))
    return Need(n, reason, cap.c, "", tuple(per_lane))


def _ttft_reason(lane: str) -> str:
    """``ttft`` for the interactive lane (the usual case), ``ttft_<lane>`` for another."""
    return "ttft" if lane == "interactive" else f"ttft_{lane}"
