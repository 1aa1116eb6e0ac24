"""Lane queue bounds, token buckets, circuit breakers, and warnings."""

from __future__ import annotations

import math

import pytest

from controlplane.planner.inputs import PlanInputs, TenantClass
from controlplane.planner.plan import make_plan

from .conftest import seed_inputs


def test_lane_max_wait_and_queue_bounds(seed: PlanInputs) -> None:
    plan = make_plan(seed)
    inter, batch = plan.lanes
    # max wait = TTFT budget − (prefill of the p95 prompt + its step) = 1000 − (300 + 20) ms
    assert inter.max_wait_s == pytest.approx(0.68)
    # 6 replicas; interactive drains at 1/τ = 1/0.35 per replica: ⌊0.68 × 2.857⌋ = 1
    assert plan.replicas == 6
    assert inter.queue_bound == math.floor(0.68 / 0.35) == 1
    assert inter.pool_queue_bound == 6
    # batch drains at what interactive leaves: 1/0.35 − 8/6
    assert batch.max_wait_s == pytest.approx(29.68)
    assert batch.queue_bound == math.floor(29.68 * (1 / 0.35 - 8 / 6)) == 45
    # M/M/c drains at c/S = 40/10.1 on 4 replicas
    mmc = make_plan(seed, model="mmc")
    assert mmc.lanes[0].queue_bound == math.floor(0.68 * 40 / 10.1) == 2
    # strict priority: interactive waits less than FCFS, batch more
    fcfs = plan.wait().mean_s
    assert inter.mean_wait_s < fcfs < batch.mean_wait_s


def test_token_buckets_from_contract_and_burst(seed: PlanInputs) -> None:
    plan = make_plan(seed)
    pro = next(b for b in plan.buckets if b.tier == "pro")
    assert pro.token_refill_per_s == pytest.approx(4 * (1000 + 500))
    assert pro.token_burst == 20 * (3000 + 1200)
    assert (pro.request_burst, pro.request_refill_per_s) == (20, 4.0)
    assert pro.burst_backlog_s == pytest.approx(20 / (6 / 0.35 - 10))


def test_breakers_per_priority(seed: PlanInputs) -> None:
    plan = make_plan(seed)
    inter, batch = plan.breakers
    assert (inter.max_connections, inter.max_pending_requests) == (6 * 40, 6 * 1)
    assert inter.max_requests == inter.max_connections + inter.max_pending_requests
    # batch keeps out of the slots interactive needs on average: ⌈8·10.1/6⌉ = 14 → 26 left
    assert batch.max_connections == 6 * (40 - 14)
    shared = make_plan(seed, envoys=2).breakers[0]
    assert shared.max_connections == 120


def test_overcommitted_contracts_and_oversized_bursts_warn() -> None:
    plan = make_plan(seed_inputs(tenants=(TenantClass("big", 50.0, 5000),)))
    text = " ".join(plan.warnings)
    assert "exceeds the planned 10 req/s by 40 req/s" in text
    assert "a full burst (5000 requests) exceeds" in text
