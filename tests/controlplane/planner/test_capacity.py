"""The seed's worked example, replica counts, and infeasible inputs."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.profiles import get_profile
from controlplane.planner.capacity import replica_capacity, service_time_s, wait_estimate
from controlplane.planner.errors import InfeasibleError, PlanInputError
from controlplane.planner.inputs import PlanInputs, TokenDist, TrafficClass
from controlplane.planner.plan import explode_utilization, make_plan
from controlplane.planner.replica import FlatReplica

from .conftest import seed_inputs


def test_seed_worked_example_gives_exactly_40_streams(seed: PlanInputs) -> None:
    cap = replica_capacity(seed)
    assert cap.c_tbt == 40 and cap.c == 40 and cap.binding == "TBT budget"
    step = next(s for s in cap.steps if s.key == "c_tbt")
    assert "50 tok/s" in step.formula and "⌊2000 / 50⌋ = 40" in step.formula


def test_seed_profile_shared_with_the_emulator_also_gives_40() -> None:
    cap = replica_capacity(seed_inputs(replica=get_profile("seed-2k")))
    assert cap.c_tbt == 40


@settings(deadline=None)  # timing is not under test; a loaded machine must not fail it
@given(t=st.integers(100, 50_000), tbt_ms=st.integers(1, 200))
def test_flat_concurrency_is_floor_of_throughput_times_tbt(t: int, tbt_ms: int) -> None:
    rep = FlatReplica(decode_tok_s=float(t), prefill_tok_s=1e4)
    c = rep.max_concurrency_for_tbt(tbt_ms / 1000)
    assert c == (t * tbt_ms) // 1000  # exact integer arithmetic


def test_service_time_and_little_and_replicas(seed: PlanInputs) -> None:
    plan = make_plan(seed)
    cap = plan.capacity
    # S = 1000/10000 s prefill + 500 tokens × 20 ms = 10.1 s
    assert cap.service_s == pytest.approx(10.1)
    little = next(s for s in plan.steps if s.key == "little_l")
    assert little.value == pytest.approx(10 * 10.1)  # L = λ·S
    # batch-aware: τ = t_p + out·itl(c)/c = 0.1 + 500·0.02/40 = 0.35 s of replica per request
    assert cap.tau_s == pytest.approx(0.35)
    assert plan.replicas_for_utilization == math.ceil(10 * 0.35 / 0.65) == 6
    assert plan.replicas == 6
    assert plan.utilization == pytest.approx(10 * 0.35 / 6)
    assert plan.headroom_qps == pytest.approx(6 / 0.35 - 10)
    # the textbook M/M/c view (c independent servers of S each) plans fewer
    mmc = make_plan(seed, model="mmc")
    assert mmc.replicas_for_utilization == math.ceil(101 / (40 * 0.65)) == 4
    assert mmc.utilization == pytest.approx(101 / 160)
    assert mmc.headroom_qps == pytest.approx(4 * 40 / 10.1 - 10)


def test_without_prefill_batch_aware_and_mmc_agree_on_capacity() -> None:
    inputs = seed_inputs(prompt=TokenDist(0, 0))
    cap = replica_capacity(inputs)
    assert cap.rate("batch") == pytest.approx(cap.rate("mmc")) == pytest.approx(4.0)


def test_mean_tbt_under_load_counts_prefill_steps(seed: PlanInputs) -> None:
    plan = make_plan(seed)
    step = next(s for s in plan.steps if s.key == "tbt_under_load")
    f = (10 / 6) * 0.1  # λ/N · t_p
    assert "1 − 0.167" in step.formula
    assert step.value > plan.inputs.replica.itl_s(1) / (1 - f) - 1e-12
    assert any("mean TBT at the planned load" in w for w in plan.warnings) == (step.value > 0.020)


def test_prefix_cache_hits_shorten_prefill() -> None:
    cold = replica_capacity(seed_inputs())
    warm = replica_capacity(seed_inputs(prefix_hit_rate=0.5))
    assert warm.ttft_floor_s == pytest.approx(0.150 + 0.020)
    assert cold.ttft_floor_s == pytest.approx(0.300 + 0.020)
    assert warm.service_s == pytest.approx(cold.service_s - 0.05)


def test_kv_memory_can_bind() -> None:
    rep = FlatReplica(decode_tok_s=2000.0, prefill_tok_s=1e4, max_total_tokens=30_000)
    cap = replica_capacity(seed_inputs(replica=rep))
    assert cap.c == 20 and cap.binding == "KV cache"


def test_latency_budget_can_need_more_replicas_than_utilization() -> None:
    # a tight queue budget (TTFT 330 ms, floor 320 ms) at a loose utilization target
    plan = make_plan(seed_inputs(ttft_s=0.33, target_utilization=0.95), model="mmc")
    assert plan.replicas_for_latency > plan.replicas_for_utilization
    assert plan.wait("mmc").quantile_s <= plan.capacity.queue_budget_s


def test_wait_explodes_past_a_utilization_each_model_reports(seed: PlanInputs) -> None:
    plan = make_plan(seed)
    cap = plan.capacity
    for model in ("mmc", "batch"):
        u = explode_utilization(seed, cap, model, axis=model)
        assert u is not None and 0.3 < u < 1
        # just below the reported utilization the p95 wait is within budget, just above not
        rate = cap.rate(model)
        below = wait_estimate(seed, cap, (u - 0.01) * rate, model).quantile_s
        above = wait_estimate(seed, cap, (u + 0.01) * rate, model).quantile_s
        assert below <= cap.queue_budget_s < above
    # on the batch-aware axis (true replica load) M/M/c never sees the explosion coming
    assert dict(plan.explode_utilization)["mmc"] is None


def test_tbt_budget_below_single_stream_says_by_how_much() -> None:
    with pytest.raises(InfeasibleError) as err:
        make_plan(seed_inputs(replica=get_profile("seed-2k"), tbt_s=0.005))
    e = err.value
    assert "TBT" in str(e) and e.unit == "ms"
    assert e.shortfall == pytest.approx(get_profile("seed-2k").itl_s(1) * 1e3 - 5.0)
    assert "short by 5.1525 ms" in str(e)


def test_ttft_budget_below_prefill_says_by_how_much() -> None:
    with pytest.raises(InfeasibleError) as err:
        make_plan(seed_inputs(ttft_s=0.2))
    assert "TTFT" in str(err.value) and err.value.shortfall == pytest.approx(120.0)


def test_max_replicas_shortfall() -> None:
    with pytest.raises(InfeasibleError) as err:
        make_plan(seed_inputs(max_replicas=2))
    assert err.value.required == 6 and err.value.available == 2
    assert "short by 4 replicas" in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"target_utilization": 1.0}, "target_utilization"),
        ({"target_utilization": 0.0}, "target_utilization"),
        ({"ttft_s": -1.0}, "budgets.ttft"),
        ({"prefix_hit_rate": 1.0}, "prefix_cache_hit_rate"),
        ({"classes": ()}, "classes"),
    ],
)
def test_bad_input_names_the_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(PlanInputError) as err:
        seed_inputs(**overrides)
    assert err.value.field == field


def test_bad_distributions_and_rates() -> None:
    with pytest.raises(PlanInputError) as err:
        TrafficClass("chat", -1.0)
    assert err.value.field == "classes.chat.qps" and "got -1" in str(err.value)
    with pytest.raises(PlanInputError, match=r"below the mean .* by 100"):
        TokenDist(500, 400, field_name="output_tokens")
    with pytest.raises(PlanInputError, match="decode_tok_s"):
        FlatReplica(decode_tok_s=-5.0, prefill_tok_s=1.0)


def test_scv_from_mean_and_p95_fits_a_lognormal() -> None:
    # lognormal σ = 0.5: mean = e^{σ²/2}, p95 = e^{1.645σ}; SCV = e^{σ²} − 1
    sigma = 0.5
    d = TokenDist(math.exp(sigma**2 / 2), math.exp(1.6448536269514722 * sigma))
    assert d.scv_estimate() == pytest.approx(math.expm1(sigma**2), rel=1e-9)
    assert TokenDist.from_samples([1, 1, 1, 1]).scv == 0.0


def test_service_time_grows_with_batch_on_a_profile() -> None:
    inputs = seed_inputs(replica=get_profile("seed-2k"))
    assert service_time_s(inputs, 1) < service_time_s(inputs, 40)


def test_flat_replica_with_a_single_stream_speed_limit() -> None:
    rep = FlatReplica(decode_tok_s=2000.0, prefill_tok_s=1e4, min_itl_s=0.005)
    assert rep.itl_s(1) == 0.005 and rep.itl_s(40) == pytest.approx(0.020)
    assert rep.max_concurrency_for_tbt(0.020) == 40
    assert rep.max_concurrency_for_tbt(0.004) == 0


def test_a_tight_wait_budget_is_met_by_more_replicas_not_a_long_search() -> None:
    # 0.5 ms of queue budget: only a nearly idle pool keeps the step residual's p95 below it
    inputs = seed_inputs(replica=get_profile("seed-2k"), ttft_s=0.3205, target_utilization=0.9)
    plan = make_plan(inputs)
    assert plan.replicas_for_latency > plan.replicas_for_utilization
    assert plan.wait().quantile_s <= plan.capacity.queue_budget_s
    smaller = wait_estimate(inputs, plan.capacity, 10 / (plan.replicas - 1), "batch")
    assert smaller.quantile_s > plan.capacity.queue_budget_s
