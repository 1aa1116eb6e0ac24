"""Assemble a whole plan from inputs: capacity, replicas, waits, limits, warnings."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .capacity import (
    MODELS,
    Capacity,
    Model,
    Step,
    WaitEstimate,
    replica_capacity,
    replicas_needed,
    wait_estimate,
)
from .inputs import PlanInputs
from .limits import Breaker, Bucket, LanePlan, breakers, buckets, lane_plans
from .queueing import solve_increasing

__all__ = ["TABLE_UTILIZATIONS", "Plan", "TableRow", "make_plan", "wait_table"]

TABLE_UTILIZATIONS = (0.3, 0.5, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.98)


@dataclass(frozen=True)
class TableRow:
    """Waits at one replica when it runs at ``utilization`` = λ·S/c."""

    utilization: float
    lam: float
    p_wait: float
    by_model: tuple[WaitEstimate, ...]


@dataclass(frozen=True)
class Plan:
    inputs: PlanInputs
    model: Model
    capacity: Capacity
    replicas: int
    replicas_for_utilization: int
    replicas_for_latency: int
    utilization: float
    headroom_qps: float
    waits: tuple[WaitEstimate, ...]  # per replica at the planned load, one per model
    explode_utilization: tuple[tuple[Model, float | None], ...]
    lanes: tuple[LanePlan, ...]
    buckets: tuple[Bucket, ...]
    breakers: tuple[Breaker, ...]
    table: tuple[TableRow, ...]
    steps: tuple[Step, ...]
    warnings: tuple[str, ...]
    envoys: int = 1

    def wait(self, model: Model | None = None) -> WaitEstimate:
        wanted = model or self.model
        return next(w for w in self.waits if w.model == wanted)


def wait_table(
    inputs: PlanInputs,
    cap: Capacity,
    model: Model = "batch",
    utilizations: tuple[float, ...] = TABLE_UTILIZATIONS,
) -> tuple[TableRow, ...]:
    """Per-replica waits across utilizations (λ / rate of ``model``), every model side by side."""
    rows = []
    for u in utilizations:
        lam = u * cap.rate(model)
        ests = tuple(wait_estimate(inputs, cap, lam, m) for m in MODELS)
        rows.append(TableRow(u, lam, ests[0].p_wait, ests))
    return tuple(rows)


def explode_utilization(
    inputs: PlanInputs, cap: Capacity, model: Model, axis: Model = "batch"
) -> float | None:
    """Utilization (λ / rate of ``axis``) past which ``model``'s p-quantile wait exceeds the
    queue budget; None when it never does below 1."""

    def quantile_at(u: float) -> float:
        return wait_estimate(inputs, cap, u * cap.rate(axis), model).quantile_s

    return solve_increasing(quantile_at, math.nextafter(cap.queue_budget_s, math.inf), 0.0, 0.9999)


def make_plan(inputs: PlanInputs, model: Model = "batch", envoys: int = 1) -> Plan:
    """The full plan. Raises PlanInputError / InfeasibleError with the failing constraint."""
    cap = replica_capacity(inputs)
    n, n_util, n_lat, rsteps = replicas_needed(inputs, cap, model)
    lam_r = inputs.total_qps / n
    rate = cap.rate(model)
    util = lam_r / rate
    headroom = n * rate - inputs.total_qps
    waits = tuple(wait_estimate(inputs, cap, lam_r, m) for m in MODELS)
    chosen = next(w for w in waits if w.model == model)
    lanes = lane_plans(inputs, cap, n, chosen.mean_s, chosen.quantile_s, rate)
    bks = buckets(inputs, cap, n, rate)
    brs = breakers(inputs, cap, n, lanes, envoys)
    explode = tuple((m, explode_utilization(inputs, cap, m, model)) for m in MODELS)
    q = f"p{inputs.quantile * 100:g}"
    steps = (
        *cap.steps,
        *rsteps,
        Step(
            "utilization",
            "utilization at the planned load",
            (
                f"ρ = λ·τ / N = {inputs.total_qps:g}·{cap.tau_s:.4g} / {n} = {util:.4g}"
                if model == "batch"
                else f"ρ = λ·S / (N·c) = {inputs.total_qps:g}·{cap.service_s:.4g} / ({n}·{cap.c})"
                f" = {util:.4g}"
            ),
            util,
            "",
        ),
        Step(
            "headroom",
            "headroom",
            f"N·rate − λ = {n}·{rate:.4g} − {inputs.total_qps:g} = "
            f"{headroom:.4g} req/s ({headroom / inputs.total_qps * 100:.3g}% more traffic fits)",
            headroom,
            "req/s",
        ),
        _tbt_under_load(inputs, cap, lam_r, waits[2].mean_concurrency),
        Step(
            "erlang_c",
            "M/M/c: probability a request waits (Erlang C, per replica)",
            f"a = (λ/N)·S = {lam_r:.4g}·{cap.service_s:.4g} = {lam_r * cap.service_s:.4g} Erl, "
            f"c = {cap.c}: C(c, a) = {waits[0].p_wait:.4g}; Wq = C·S/(c − a) = "
            f"{waits[0].mean_s * 1e3:.4g} ms; {q} = ln(C/{1 - inputs.quantile:.2g})·S/(c − a) = "
            f"{waits[0].quantile_s * 1e3:.4g} ms",
            waits[0].p_wait,
            "",
        ),
        Step(
            "allen_cunneen",
            "M/G/c: Allen–Cunneen correction",
            f"Wq ≈ Wq(M/M/c)·(1 + Cs²)/2 with Cs² = {cap.cs2:.3g}: mean "
            f"{waits[1].mean_s * 1e3:.4g} ms, {q} {waits[1].quantile_s * 1e3:.4g} ms",
            waits[1].mean_s,
            "s",
        ),
        *(s for lp in lanes for s in lp.steps),
        *(s for b in bks for s in b.steps),
    )
    return Plan(
        inputs=inputs,
        model=model,
        capacity=cap,
        replicas=n,
        replicas_for_utilization=n_util,
        replicas_for_latency=n_lat,
        utilization=util,
        headroom_qps=headroom,
        waits=waits,
        explode_utilization=explode,
        lanes=lanes,
        buckets=bks,
        breakers=brs,
        table=wait_table(inputs, cap, model),
        steps=steps,
        warnings=_warnings(inputs, cap, n, lanes, bks, steps),
        envoys=envoys,
    )


def _tbt_under_load(inputs: PlanInputs, cap: Capacity, lam_r: float, conc: float) -> Step:
    """Mean time between tokens once prefill takes its share: itl(b̄) / (1 − λ·t_p)."""
    f = lam_r * cap.prefill_s
    # an unstable load (another queue model's replica count) has no finite mean: the batch is full
    b = min(cap.c, max(1, math.ceil(conc))) if math.isfinite(conc) else cap.c
    itl = inputs.replica.itl_s(b)
    tbt = itl / (1 - f) if f < 1 else math.inf
    return Step(
        "tbt_under_load",
        "mean TBT at the planned load (prefill steps included)",
        f"itl(b̄ = {b}) / (1 − λ/N·t_p) = {itl * 1e3:.4g} ms / (1 − {f:.3g}) = {tbt * 1e3:.4g} ms"
        f" (budget {inputs.tbt_s * 1e3:g} ms)",
        tbt,
        "s",
    )


def _warnings(
    inputs: PlanInputs,
    cap: Capacity,
    n: int,
    lanes: tuple[LanePlan, ...],
    bks: tuple[Bucket, ...],
    steps: tuple[Step, ...],
) -> tuple[str, ...]:
    out = []
    tbt = next(s.value for s in steps if s.key == "tbt_under_load")
    if tbt > inputs.tbt_s * (1 + 1e-9):
        out.append(
            f"mean TBT at the planned load is {tbt * 1e3:.4g} ms, over the {inputs.tbt_s * 1e3:g}"
            f" ms budget by {(tbt - inputs.tbt_s) * 1e3:.3g} ms: prefill steps stall decoding; "
            "lower max_running_requests below c, or add replicas"
        )
    contracted = sum(t.avg_qps for t in inputs.tenants)
    if inputs.tenants and contracted > inputs.total_qps * (1 + 1e-9):
        out.append(
            f"tenants' contracted average {contracted:g} req/s exceeds the planned "
            f"{inputs.total_qps:g} req/s by {contracted - inputs.total_qps:g} req/s "
            f"({(contracted / inputs.total_qps - 1) * 100:.3g}%)"
        )
    for lp in lanes:
        if lp.queue_bound == 0:
            out.append(
                f"lane {lp.lane}: max wait {lp.max_wait_s * 1e3:.4g} ms is shorter than one "
                f"completion ({1e3 / lp.drain_rate if lp.drain_rate else math.inf:.4g} ms): "
                "queue bound 0, requests that find the replica full are rejected"
            )
    for b in bks:
        pool_q = sum(lp.pool_queue_bound for lp in lanes)
        if b.request_burst > pool_q:
            out.append(
                f"tier {b.tier}: a full burst ({b.request_burst} requests) exceeds the pool's "
                f"queue bounds ({pool_q}) by {b.request_burst - pool_q}: part of it is rejected"
            )
    return tuple(out)
