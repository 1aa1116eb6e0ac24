"""Render a plan for people (text with Markdown tables) and for programs (JSON)."""

from __future__ import annotations

import json
import math

from .capacity import MODELS, Step
from .plan import Plan

__all__ = ["plan_json", "plan_text"]


def _ms(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x * 1e3:.4g} ms"


def _step_lines(steps: tuple[Step, ...]) -> list[str]:
    out = []
    for s in steps:
        value = f"{s.value:.6g}" if isinstance(s.value, float) else str(s.value)
        out.append(f"- **{s.label}**: {value} {s.unit}".rstrip())
        out.append(f"  `{s.formula}`")
    return out


def plan_text(plan: Plan) -> str:
    """The whole plan with formulas; Markdown that also reads well in a terminal."""
    i, cap = plan.inputs, plan.capacity
    q = f"p{i.quantile * 100:g}"
    backend = i.profile_name or "flat replica"
    lines = [
        f"# Capacity plan: pool {i.pool} ({backend})",
        "",
        f"Inputs: {i.total_qps:g} req/s ("
        + ", ".join(f"{c.name} {c.qps:g} {c.lane}" for c in i.classes)
        + f"); prompt mean {i.prompt.mean:g} / p95 {i.prompt.p95:g} tokens; output mean "
        f"{i.output.mean:g} / p95 {i.output.p95:g}; TTFT ≤ {_ms(i.ttft_s)}, TBT ≤ "
        f"{_ms(i.tbt_s)}; target utilization {i.target_utilization:g}; prefix-cache hit rate "
        f"{i.prefix_hit_rate:g}.",
        "",
        f"**Result: {plan.replicas} replicas × {cap.c} slots, utilization "
        f"{plan.utilization:.3g}, headroom {plan.headroom_qps:.4g} req/s** "
        f"(sized with the {MODELS[plan.model]} model).",
        "",
        "## How each number follows",
        *_step_lines(plan.steps),
        "",
        f"## Queueing per replica at the planned load (λ/N = {i.total_qps / plan.replicas:.4g}"
        " req/s)",
        f"| model | P(wait) | mean wait | {q} wait | mean concurrency |",
        "|---|---|---|---|---|",
        *(
            f"| {MODELS[w.model]} | {w.p_wait:.4g} | {_ms(w.mean_s)} | {_ms(w.quantile_s)} | "
            f"{w.mean_concurrency:.4g} |"
            for w in plan.waits
        ),
        "",
        f"Where the wait explodes ({q} wait > queue budget {_ms(cap.queue_budget_s)}): "
        + ", ".join(
            f"{MODELS[m]} past ρ = {'never' if u is None else f'{u:.3f}'}"
            for m, u in plan.explode_utilization
        )
        + ".",
        "",
        f"## Wait vs utilization (one replica, c = {cap.c}, S = {cap.service_s:.4g} s, "
        + ("ρ = λ·τ)" if plan.model == "batch" else "ρ = λ·S/c)"),
        "| ρ | λ (req/s) | P(wait) M/M/c | "
        + " | ".join(f"mean / {q} {MODELS[m].split(' ')[0]}" for m in MODELS)
        + " |",
        "|---|---|---|" + "---|" * len(MODELS),
        *(
            f"| {r.utilization:g} | {r.lam:.4g} | {r.p_wait:.3g} | "
            + " | ".join(f"{_ms(w.mean_s)} / {_ms(w.quantile_s)}" for w in r.by_model)
            + " |"
            for r in plan.table
        ),
        "",
        "## Lanes (interactive first, strict priority)",
        f"| lane | QPS | max wait | queue bound / replica | pool bound | mean wait | {q} wait |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {lp.lane} | {lp.qps:g} | {_ms(lp.max_wait_s)} | {lp.queue_bound} | "
            f"{lp.pool_queue_bound} | {_ms(lp.mean_wait_s)} | {_ms(lp.quantile_wait_s)} |"
            for lp in plan.lanes
        ),
        "",
        "## Token buckets per tier",
        "| tier | tokens: burst C | tokens: refill r (tok/s) | requests: burst | requests: r/s |"
        " burst backlog |",
        "|---|---|---|---|---|---|",
        *(
            f"| {b.tier} | {b.token_burst} | {b.token_refill_per_s:.6g} | {b.request_burst} | "
            f"{b.request_refill_per_s:g} | {b.burst_backlog_s:.4g} s |"
            for b in plan.buckets
        ),
        "",
        f"## Circuit breakers per priority (per Envoy, {plan.envoys} Envoy(s))",
        *(f"- `{b.formula}`" for b in plan.breakers),
    ]
    if plan.warnings:
        lines += ["", "## Warnings", *(f"- {w}" for w in plan.warnings)]
    return "\n".join(lines) + "\n"


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def plan_json(plan: Plan) -> str:
    """The numbers of a plan as JSON (∞ as null)."""
    i, cap = plan.inputs, plan.capacity
    data: dict[str, object] = {
        "pool": i.pool,
        "backend": i.profile_name or "flat",
        "replicas": plan.replicas,
        "replicas_for_utilization": plan.replicas_for_utilization,
        "replicas_for_latency": plan.replicas_for_latency,
        "slots_per_replica": cap.c,
        "slots_binding": cap.binding,
        "service_s": cap.service_s,
        "ttft_floor_s": cap.ttft_floor_s,
        "queue_budget_s": cap.queue_budget_s,
        "utilization": plan.utilization,
        "headroom_qps": plan.headroom_qps,
        "model": plan.model,
        "waits": {
            w.model: {
                "p_wait": w.p_wait,
                "mean_s": _finite(w.mean_s),
                "quantile_s": _finite(w.quantile_s),
                "mean_concurrency": _finite(w.mean_concurrency),
            }
            for w in plan.waits
        },
        "explode_utilization": dict(plan.explode_utilization),
        "lanes": {
            lp.lane: {
                "max_wait_s": lp.max_wait_s,
                "queue_bound": lp.queue_bound,
                "pool_queue_bound": lp.pool_queue_bound,
                "mean_wait_s": _finite(lp.mean_wait_s),
            }
            for lp in plan.lanes
        },
        "buckets": {
            b.tier: {
                "token_burst": b.token_burst,
                "token_refill_per_s": b.token_refill_per_s,
                "request_burst": b.request_burst,
                "request_refill_per_s": b.request_refill_per_s,
            }
            for b in plan.buckets
        },
        "steps": [{"key": s.key, "formula": s.formula, "value": s.value} for s in plan.steps],
        "warnings": list(plan.warnings),
    }
    return json.dumps(data, indent=2, ensure_ascii=False)
