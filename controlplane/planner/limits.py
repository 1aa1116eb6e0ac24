"""Limits derived from a capacity plan: per-lane queue bounds and waits, token buckets per
tenant class, and Envoy circuit-breaker thresholds per priority. Pure functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .capacity import Capacity, Step
from .inputs import LANES, Lane, PlanInputs

__all__ = ["Breaker", "Bucket", "LanePlan", "breakers", "buckets", "lane_plans"]


@dataclass(frozen=True)
class LanePlan:
    """Queueing limits of one lane (interactive is served first, batch takes what is left)."""

    lane: Lane
    qps: float
    ttft_budget_s: float
    max_wait_s: float  # TTFT budget − TTFT floor
    drain_rate: float  # completions/s per replica available to this lane's queue
    queue_bound: int  # per replica
    pool_queue_bound: int
    mean_wait_s: float  # non-preemptive priority M/M/c (Cobham), per replica
    quantile_wait_s: float
    steps: tuple[Step, ...]


def lane_plans(
    inputs: PlanInputs,
    cap: Capacity,
    replicas: int,
    fcfs_mean_wait_s: float,
    fcfs_quantile_s: float,
    full_rate: float,
) -> tuple[LanePlan, ...]:
    """Max wait and queue bound per lane, and its wait under strict priority.

    Queue bound = ⌊max wait × drain rate⌋: a request that finds more ahead of it cannot start
    within its TTFT budget, so rejecting it at once (with Retry-After) is kinder than a timeout.
    ``full_rate`` is what one replica completes per second (1/τ batch-aware, c/S for M/M/c).
    Interactive drains at that rate per replica; batch only at what interactive leaves.
    Priority waits (Cobham): W_k = W_fcfs·(1 − ρ) / ((1 − σ_{k−1})(1 − σ_k)); the lane's
    quantile is the FCFS quantile scaled by the same factor (an approximation).
    """
    rho = inputs.total_qps / (replicas * full_rate)
    out: list[LanePlan] = []
    sigma_prev = 0.0
    for lane in LANES:
        qps = inputs.lane_qps(lane)
        if qps <= 0 and lane == "batch":
            continue
        budget = inputs.lane_ttft_s(lane)
        max_wait = max(0.0, budget - cap.ttft_floor_s)
        used_before = sigma_prev * full_rate
        drain = max(0.0, full_rate - used_before)
        bound = math.floor(max_wait * drain + 1e-9)
        sigma = sigma_prev + qps / (replicas * full_rate)
        if sigma >= 1:
            mean_w = math.inf
        else:
            mean_w = fcfs_mean_wait_s * (1 - rho) / ((1 - sigma_prev) * (1 - sigma))
        scale = mean_w / fcfs_mean_wait_s if fcfs_mean_wait_s > 0 else 1.0
        quant = fcfs_quantile_s * scale  # the FCFS quantile scaled like the mean
        steps = (
            Step(
                f"{lane}.max_wait_s",
                f"{lane}: maximum queue wait",
                f"TTFT budget − TTFT floor = {budget * 1e3:.4g} − {cap.ttft_floor_s * 1e3:.4g}"
                f" = {max_wait * 1e3:.4g} ms",
                max_wait,
                "s",
            ),
            Step(
                f"{lane}.queue_bound",
                f"{lane}: queue bound per replica",
                f"⌊max wait × drain⌋ = ⌊{max_wait:.4g} s × {drain:.4g} req/s⌋ = {bound}"
                f" (pool: × {replicas} = {bound * replicas})",
                bound,
                "requests",
            ),
        )
        out.append(
            LanePlan(
                lane, qps, budget, max_wait, drain, bound, bound * replicas, mean_w, quant, steps
            )
        )
        sigma_prev = sigma
    return tuple(out)


@dataclass(frozen=True)
class Bucket:
    """Token buckets of one tenant class: tokens (burst C, refill r) and requests."""

    tier: str
    token_burst: int
    token_refill_per_s: float
    request_burst: int
    request_refill_per_s: float
    burst_backlog_s: float  # extra queueing a full burst adds on the planned pool
    steps: tuple[Step, ...]


def buckets(
    inputs: PlanInputs, cap: Capacity, replicas: int, full_rate: float
) -> tuple[Bucket, ...]:
    """C and r per tenant class from contracted average QPS and burst size.

    r_tokens = avg QPS × (mean prompt + mean output): the long-run token rate the contract buys.
    C_tokens = burst × (p95 prompt + p95 output): what a burst reserves before usage settles.
    A full burst lands on the spare capacity N·rate − λ and waits burst / spare seconds.
    """
    mean_tok = inputs.prompt.mean + inputs.output.mean
    p95_tok = inputs.prompt.p95 + inputs.output.p95
    spare = replicas * full_rate - inputs.total_qps
    out = []
    for t in inputs.tenants:
        r_tok = t.avg_qps * mean_tok
        c_tok = math.ceil(t.burst_requests * p95_tok)
        backlog = t.burst_requests / spare if spare > 0 else math.inf
        steps = (
            Step(
                f"{t.name}.refill",
                f"tier {t.name}: token refill r",
                f"r = avg QPS × (prompt + output)_mean = {t.avg_qps:g} × {mean_tok:g} "
                f"= {r_tok:.6g} tok/s",
                r_tok,
                "tok/s",
            ),
            Step(
                f"{t.name}.burst",
                f"tier {t.name}: token burst C",
                f"C = burst × (prompt + output)_p95 = {t.burst_requests} × {p95_tok:g} = {c_tok}",
                c_tok,
                "tokens",
            ),
            Step(
                f"{t.name}.backlog",
                f"tier {t.name}: queueing a full burst adds",
                f"burst / (N·rate − λ) = {t.burst_requests} / {spare:.4g} = {backlog:.4g} s",
                backlog,
                "s",
            ),
        )
        out.append(
            Bucket(
                t.name,
                max(1, c_tok),
                r_tok,
                t.burst_requests,
                t.avg_qps,
                backlog,
                steps,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class Breaker:
    """Envoy circuit-breaker thresholds for one lane's priority, per Envoy instance."""

    lane: Lane
    max_connections: int
    max_pending_requests: int
    max_requests: int
    max_retries: int
    formula: str


def breakers(
    inputs: PlanInputs, cap: Capacity, replicas: int, lanes: tuple[LanePlan, ...], envoys: int = 1
) -> tuple[Breaker, ...]:
    """Thresholds per priority so Envoy holds the queue the plan allows and no more.

    With one request per upstream connection, connections = running slots, pending = queue:
    interactive: connections N·c, pending N·Q_i, requests N·(c + Q_i);
    batch: slots left after interactive's mean concurrency, N·(c − ⌈λ_i·S/N⌉), pending N·Q_b.
    Retries: 10% of the slots (at least 3). Each of ``envoys`` Envoys gets its share (ceil).
    """
    out = []
    interactive_load = inputs.lane_qps("interactive") * cap.service_s / replicas
    for lp in lanes:
        if lp.lane == "interactive":
            slots = cap.c
        else:
            slots = max(1, cap.c - math.ceil(interactive_load - 1e-9))
        conns = math.ceil(replicas * slots / envoys)
        pending = math.ceil(replicas * lp.queue_bound / envoys)
        retries = max(3, math.ceil(0.1 * conns))
        formula = (
            f"{lp.lane}: connections ⌈N·{slots}/E⌉ = {conns}, pending ⌈N·Q/E⌉ = ⌈{replicas}·"
            f"{lp.queue_bound}/{envoys}⌉ = {pending}, requests = {conns + pending}, "
            f"retries = max(3, 10%) = {retries}"
        )
        out.append(Breaker(lp.lane, conns, pending, conns + pending, retries, formula))
    return tuple(out)
