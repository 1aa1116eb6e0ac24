"""Per-replica capacity, service time, replica count and queueing waits: the core of a plan.

Every number comes with the formula that produced it (a :class:`Step`), so an operator can redo
the plan by hand. Pure functions; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from .batch_model import batch_predict
from .errors import InfeasibleError
from .inputs import PlanInputs
from .queueing import (
    erlang_c,
    mgc_wait_mean,
    mgc_wait_quantile,
    mmc_wait_mean,
    mmc_wait_quantile,
)
from .replica import FlatReplica

__all__ = [
    "MODELS",
    "Capacity",
    "Model",
    "Step",
    "WaitEstimate",
    "replica_capacity",
    "replicas_needed",
    "wait_estimate",
]

Model = Literal["mmc", "mgc", "batch"]
MODELS: Mapping[Model, str] = MappingProxyType(
    {
        "mmc": "M/M/c (Erlang C)",
        "mgc": "M/G/c (Allen–Cunneen)",
        "batch": "batch-aware (itl(b) chain + prefill + step residual)",
    }
)
_MAX_REPLICAS_SEARCH = 100_000


@dataclass(frozen=True)
class Step:
    """One output of the plan, with the formula and the numbers that produced it."""

    key: str
    label: str
    formula: str
    value: float
    unit: str


@dataclass(frozen=True)
class Capacity:
    """What one replica can carry within the TBT budget, and how long a request holds a slot."""

    c: int  # batch slots per replica (the binding limit)
    c_tbt: int
    c_kv: int
    binding: str
    prefill_s: float  # mean uncached prefill time
    ttft_floor_s: float  # TTFT of the p95 prompt on a free slot: prefill + its step(s)
    service_s: float  # S = S(c): time a request holds a slot when the batch is full
    tau_s: float  # replica time per request: t_p + out·itl(c)/c (prefill stalls every stream)
    queue_budget_s: float  # TTFT budget − TTFT floor: what queueing may use
    cs2: float  # SCV of the service time (from the output-token distribution)
    steps: tuple[Step, ...]

    @property
    def slot_rate(self) -> float:
        """Completions per second of one full replica as M/M/c sees it: c / S."""
        return self.c / self.service_s

    def rate(self, model: Model) -> float:
        """Most completions per second of one replica under ``model``.

        M/M/c and M/G/c: c / S (c independent servers). Batch-aware: 1/τ, because a prefill
        step stalls all c streams while decode steps are shared by c.
        """
        return 1.0 / self.tau_s if model == "batch" else self.slot_rate


def _uncached(inputs: PlanInputs, tokens: float) -> float:
    return (1.0 - inputs.prefix_hit_rate) * tokens


def service_time_s(inputs: PlanInputs, batch: int) -> float:
    """S(b) = uncached mean prompt / prefill rate + mean output · itl(b).

    The first token comes out of the prefill step, which also carries a decode step, so the
    output costs ``out`` steps in all.
    """
    rep = inputs.replica
    prefill = _uncached(inputs, inputs.prompt.mean) / rep.prefill_tok_s
    return prefill + inputs.output.mean * rep.itl_s(batch)


def _tbt_step(inputs: PlanInputs, c_tbt: int) -> Step:
    rep, tbt = inputs.replica, inputs.tbt_s
    label = "max concurrency per replica from the TBT budget"
    if isinstance(rep, FlatReplica) and rep.step_overhead_s == 0:
        per_stream = 1.0 / tbt
        formula = (
            f"each stream needs 1/TBT = 1/{tbt:g} s = {per_stream:g} tok/s; "
            f"c_tbt = ⌊T / (1/TBT)⌋ = ⌊{rep.decode_tok_s:g} / {per_stream:g}⌋ = {c_tbt}"
        )
    else:
        nxt = rep.itl_s(c_tbt + 1) * 1e3 if c_tbt >= 1 else math.nan
        cur = rep.itl_s(max(c_tbt, 1)) * 1e3
        formula = (
            f"c_tbt = largest b with itl(b) ≤ TBT = {tbt * 1e3:g} ms: "
            f"itl({c_tbt}) = {cur:.3f} ms, itl({c_tbt + 1}) = {nxt:.3f} ms → {c_tbt}"
        )
    return Step("c_tbt", label, formula, c_tbt, "streams")


def replica_capacity(inputs: PlanInputs) -> Capacity:
    """Slots per replica (TBT, KV memory, max_running_requests), service time, TTFT floor."""
    rep = inputs.replica
    c_tbt = rep.max_concurrency_for_tbt(inputs.tbt_s)
    if c_tbt < 1:
        raise InfeasibleError(
            "TBT budget below the time between tokens of a single stream",
            required=rep.itl_s(1) * 1e3,
            available=inputs.tbt_s * 1e3,
            unit="ms",
            hint="no replica count can meet it: raise the TBT budget or use faster hardware",
        )
    per_request_kv = inputs.prompt.mean + inputs.output.mean
    c_kv = math.floor(rep.max_total_tokens / per_request_kv) if per_request_kv > 0 else c_tbt
    if c_kv < 1:
        raise InfeasibleError(
            "KV cache of one replica smaller than one mean request",
            required=per_request_kv,
            available=rep.max_total_tokens,
            unit="tokens",
        )
    limits = {
        "TBT budget": c_tbt,
        "KV cache": c_kv,
        "max_running_requests": rep.max_running_requests,
    }
    binding = min(limits, key=lambda k: limits[k])
    c = limits[binding]
    prefill_s = _uncached(inputs, inputs.prompt.mean) / rep.prefill_tok_s
    prefill_p95_s = _uncached(inputs, inputs.prompt.p95) / rep.prefill_tok_s
    chunk = getattr(rep, "chunked_prefill_size", None)
    uncached_p95 = _uncached(inputs, inputs.prompt.p95)
    prefill_steps = max(1, math.ceil(uncached_p95 / chunk)) if chunk else 1
    floor = prefill_p95_s + prefill_steps * rep.itl_s(c)
    if floor >= inputs.ttft_s:
        raise InfeasibleError(
            "TTFT budget below the TTFT of the p95 prompt on a free slot (prefill + its step)",
            required=floor * 1e3,
            available=inputs.ttft_s * 1e3,
            unit="ms",
            hint="no replica count can meet it: raise the TTFT budget, shorten prompts "
            "or raise the prefix-cache hit rate",
        )
    s = service_time_s(inputs, c)
    tau = prefill_s + inputs.output.mean * rep.itl_s(c) / c
    h = inputs.prefix_hit_rate
    context = (
        (
            Step(
                "context",
                "the profile's context terms at this workload",
                inputs.context_note,
                inputs.prompt.mean + inputs.output.mean / 2,
                "tokens",
            ),
        )
        if inputs.context_note
        else ()
    )
    steps = (
        *context,
        _tbt_step(inputs, c_tbt),
        Step(
            "c_kv",
            "max concurrency per replica from KV memory",
            f"c_kv = ⌊max_total_tokens / (prompt + output)⌋ = "
            f"⌊{rep.max_total_tokens} / {per_request_kv:g}⌋ = {c_kv}",
            c_kv,
            "streams",
        ),
        Step(
            "c",
            "batch slots per replica",
            f"c = min(c_tbt = {c_tbt}, c_kv = {c_kv}, max_running_requests = "
            f"{rep.max_running_requests}) = {c} (bound by {binding})",
            c,
            "streams",
        ),
        Step(
            "service_s",
            "time a request holds a slot with the batch full",
            f"S = (1 − h)·prompt/prefill + output·itl(c) = (1 − {h:g})·{inputs.prompt.mean:g}/"
            f"{rep.prefill_tok_s:g} + {inputs.output.mean:g}·{rep.itl_s(c):.6g} = {s:.4g} s",
            s,
            "s",
        ),
        Step(
            "tau_s",
            "replica time per request (batch-aware capacity)",
            f"τ = t_p + output·itl(c)/c = {prefill_s:.4g} + {inputs.output.mean:g}·"
            f"{rep.itl_s(c):.6g}/{c} = {tau:.4g} s → one replica completes at most 1/τ = "
            f"{1 / tau:.4g} req/s (M/M/c says c/S = {c / s:.4g}: it misses that a prefill step "
            "stalls every running stream)",
            tau,
            "s",
        ),
        Step(
            "ttft_floor_s",
            "TTFT of the p95 prompt on a free slot (no queueing)",
            f"(1 − {h:g})·{inputs.prompt.p95:g}/{rep.prefill_tok_s:g} + {prefill_steps} step(s)"
            f" · itl(c) = {prefill_p95_s * 1e3:.4g} + {prefill_steps}·{rep.itl_s(c) * 1e3:.4g}"
            f" = {floor * 1e3:.4g} ms (prefill shares its step with the full decode batch)",
            floor,
            "s",
        ),
    )
    return Capacity(
        c=c,
        c_tbt=c_tbt,
        c_kv=c_kv,
        binding=binding,
        prefill_s=prefill_s,
        ttft_floor_s=floor,
        service_s=s,
        tau_s=tau,
        queue_budget_s=inputs.ttft_s - floor,
        cs2=_service_scv(inputs, s, c),
        steps=steps,
    )


def _service_scv(inputs: PlanInputs, s: float, c: int) -> float:
    """SCV of S = prompt·(1 − h)/prefill + output·itl(c), prompt and output independent."""
    if s <= 0:
        return 0.0
    rep = inputs.replica
    out, pr = inputs.output, inputs.prompt
    k = (1.0 - inputs.prefix_hit_rate) / rep.prefill_tok_s
    decode_var = (rep.itl_s(c) * out.mean) ** 2 * out.scv_estimate()
    prefill_var = (k * pr.mean) ** 2 * pr.scv_estimate()
    return (decode_var + prefill_var) / (s * s)


@dataclass(frozen=True)
class WaitEstimate:
    """Queueing at one replica under one model, for arrival rate ``lam`` (req/s)."""

    model: Model
    lam: float
    p_wait: float
    mean_s: float
    quantile_s: float
    mean_concurrency: float  # running + queued, per replica


def wait_estimate(
    inputs: PlanInputs, cap: Capacity, lam: float, model: Model, q: float | None = None
) -> WaitEstimate:
    """P(wait), mean and q-quantile wait, and mean concurrency of one replica at rate ``lam``."""
    q = inputs.quantile if q is None else q
    s, c = cap.service_s, cap.c
    if model == "batch":
        bp = batch_predict(lam, c, inputs.output.mean, inputs.replica.itl_s, cap.prefill_s)
        return WaitEstimate(
            model, lam, bp.p_wait, bp.mean_wait_s, bp.wait_quantile(q), bp.mean_in_system
        )
    a = lam * s
    pw = erlang_c(c, a) if a < c else 1.0
    if model == "mmc":
        mean, quant = mmc_wait_mean(lam, s, c), mmc_wait_quantile(lam, s, c, q)
    else:
        mean, quant = mgc_wait_mean(lam, s, c, cap.cs2), mgc_wait_quantile(lam, s, c, cap.cs2, q)
    return WaitEstimate(model, lam, pw, mean, quant, a + lam * mean)


def _replicas_for_wait(inputs: PlanInputs, cap: Capacity, model: Model, lo: int) -> int:
    """Smallest N ≥ lo whose q-quantile wait fits the queue budget (doubling, then bisection)."""

    def fits(n: int) -> bool:
        return wait_estimate(inputs, cap, inputs.total_qps / n, model).quantile_s <= (
            cap.queue_budget_s
        )

    if fits(lo):
        return lo
    hi = lo
    while not fits(hi):
        if hi >= _MAX_REPLICAS_SEARCH:
            raise InfeasibleError(
                f"p{inputs.quantile * 100:g} queue wait within the TTFT budget at any replica count",
                required=wait_estimate(inputs, cap, inputs.total_qps / hi, model).quantile_s * 1e3,
                available=cap.queue_budget_s * 1e3,
                unit="ms",
            )
        lo, hi = hi, min(hi * 2, _MAX_REPLICAS_SEARCH)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def replicas_needed(
    inputs: PlanInputs, cap: Capacity, model: Model
) -> tuple[int, int, int, tuple[Step, ...]]:
    """(replicas, replicas for the utilization target, replicas for the wait budget, steps)."""
    lam, s, c, u = inputs.total_qps, cap.service_s, cap.c, inputs.target_utilization
    rate = cap.rate(model)
    load = lam * s
    n_util = max(1, math.ceil(lam / (rate * u) - 1e-9))
    n_lat = _replicas_for_wait(inputs, cap, model, max(1, math.floor(lam / rate) + 1))
    n = max(n_util, n_lat)
    if inputs.max_replicas is not None and n > inputs.max_replicas:
        raise InfeasibleError(
            f"replicas within max_replicas (utilization target {u:g} needs {n_util}, "
            f"the p{inputs.quantile * 100:g} wait budget {cap.queue_budget_s * 1e3:.4g} ms "
            f"needs {n_lat})",
            required=n,
            available=inputs.max_replicas,
            unit="replicas",
        )
    if model == "batch":
        util_formula = (
            f"N_u = ⌈λ·τ / ρ_target⌉ = ⌈{lam:g}·{cap.tau_s:.4g} / {u:g}⌉ = {n_util}"
            f" (M/M/c would say ⌈λ·S/(c·ρ_target)⌉ = {math.ceil(load / (c * u) - 1e-9)})"
        )
    else:
        util_formula = f"N_u = ⌈λ·S / (c·ρ_target)⌉ = ⌈{load:.4g} / ({c}·{u:g})⌉ = {n_util}"
    steps = (
        Step(
            "little_l",
            "average concurrency of the pool (Little's law)",
            f"L = λ·S = {lam:g} req/s × {s:.4g} s = {load:.4g} requests in service",
            load,
            "requests",
        ),
        Step(
            "replicas_util", "replicas for the utilization target", util_formula, n_util, "replicas"
        ),
        Step(
            "replicas_latency",
            f"replicas for the p{inputs.quantile * 100:g} wait budget ({MODELS[model]})",
            f"smallest N with p{inputs.quantile * 100:g} wait(λ/N) ≤ TTFT budget − TTFT floor "
            f"= {cap.queue_budget_s * 1e3:.4g} ms → N_w = {n_lat}",
            n_lat,
            "replicas",
        ),
        Step(
            "replicas",
            "replicas",
            f"N = max(N_u, N_w) = max({n_util}, {n_lat}) = {n}",
            n,
            "replicas",
        ),
    )
    return n, n_util, n_lat, steps
