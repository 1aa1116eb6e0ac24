"""The planner on live inputs: more load → more replicas; the binding reason; bounds, budget,
cool-downs and hysteresis."""

from __future__ import annotations

import dataclasses

import pytest

from controlplane.autoscale import Demand, Need, Stabilizer, bounded, replicas_for
from controlplane.planner import FlatReplica, profile_replica
from policy.autoscale import AutoscalePolicy

SEED = profile_replica("seed-2k")
D = Demand(prompt_mean=500.0, output_mean=200.0, measured=True)


def test_more_load_needs_more_replicas_and_headroom_adds_some() -> None:
    kw = {"ttft_s": 1.0, "tbt_s": 0.02}
    counts = [replicas_for(D, r, SEED, headroom=0.3, **kw).replicas for r in (1, 5, 20, 60)]
    assert counts == sorted(counts) and counts[0] < counts[-1]
    lean = replicas_for(D, 60, SEED, headroom=0.0, **kw).replicas
    assert lean < counts[-1]


def test_zero_demand_needs_none_but_a_queue_sets_a_floor() -> None:
    assert replicas_for(D, 0.0, SEED, ttft_s=1.0, tbt_s=0.02, headroom=0.3) == Need(0, "idle", 40)
    n = replicas_for(
        dataclasses.replace(D, inflight=100), 0.0, SEED, ttft_s=1.0, tbt_s=0.02, headroom=0.3
    )
    assert (n.replicas, n.reason) == (3, "ttft")  # 100 in flight / 40 slots


def test_binding_reasons_tbt_kv_ttft() -> None:
    kw = {"ttft_s": 2.0, "headroom": 0.3}
    assert replicas_for(D, 10, SEED, tbt_s=0.02, **kw).reason == "tbt"
    small_kv = FlatReplica(2000, 10000, max_total_tokens=2000)  # 2000 / 700 = 2 slots
    assert replicas_for(D, 10, small_kv, tbt_s=0.05, **kw).reason == "kv"
    tight = replicas_for(D, 10, SEED, tbt_s=0.02, ttft_s=0.2, headroom=0.3)
    assert tight.reason == "ttft"


def test_a_time_scaled_replica_needs_proportionally_more() -> None:
    kw = {"ttft_s": 10.0, "tbt_s": 0.2, "headroom": 0.3}
    one = replicas_for(D, 10, SEED, time_scale=10.0, **kw).replicas
    ten = replicas_for(D, 100, SEED, time_scale=1.0, ttft_s=1.0, tbt_s=0.02, headroom=0.3).replicas
    assert one == ten  # 10x slower replicas at a tenth of the rate and 10x the budgets


def test_infeasible_budgets_say_so() -> None:
    n = replicas_for(D, 5, SEED, ttft_s=1.0, tbt_s=0.001, headroom=0.3)
    assert n.reason == "infeasible" and "TBT" in n.note


P = AutoscalePolicy(
    min_replicas=1, max_replicas=6, gpus_per_replica=2, gpu_budget=10,
    scale_up_cooldown=5.0, scale_down_cooldown=20.0, scale_down_window=10.0, window=5.0,
)  # fmt: skip


@pytest.mark.parametrize(
    ("need", "want"),
    [
        (Need(0, "idle"), (1, "min")),
        (Need(3, "ttft"), (3, "ttft")),
        (Need(1, "tbt"), (1, "tbt")),
        (Need(9, "kv"), (5, "budget")),  # 10 GPUs / 2 per replica
    ],
)
def test_bounds_and_budget(need: Need, want: tuple[int, str]) -> None:
    assert bounded(need, P) == want
    assert bounded(Need(9, "kv"), dataclasses.replace(P, gpu_budget=None)) == (6, "max")


def test_up_at_once_then_cooldown_down_only_after_the_window() -> None:
    s = Stabilizer(P, start=1)
    assert s.step(0.0, Need(3, "ttft")).desired == 3
    assert s.step(1.0, Need(4, "ttft")).desired == 3  # within the 5 s up cool-down
    assert s.step(5.0, Need(4, "tbt")).desired == 4
    for t in range(6, 25):
        assert s.step(float(t), Need(1, "tbt")).desired == 4  # down cool-down 20 s from t=5
    d = s.step(25.0, Need(1, "tbt"))
    assert (d.desired, d.reason) == (1, "tbt")


def test_a_spike_inside_the_down_window_holds_the_count() -> None:
    s = Stabilizer(dataclasses.replace(P, scale_down_cooldown=0.0), start=4)
    for t in range(0, 12):
        s.step(float(t), Need(4 if t == 8 else 2, "tbt"))
    assert s.desired == 4  # the need of 4 at t=8 is inside the 10 s window
    for t in range(12, 19):
        s.step(float(t), Need(2, "tbt"))
    assert s.desired == 4
    s.step(19.0, Need(2, "tbt"))
    assert s.desired == 2


def test_infeasible_rounds_hold_the_count() -> None:
    s = Stabilizer(P, start=3)
    assert s.step(0.0, Need(0, "infeasible", 0, "why")).desired == 3


def test_a_reload_with_tighter_bounds_is_held_at_once() -> None:
    s = Stabilizer(P, start=6)
    s.policy = dataclasses.replace(P, max_replicas=2)
    d = s.step(0.0, Need(6, "ttft"))
    assert (d.desired, d.reason) == (2, "max")


def test_before_any_request_finished_only_the_queue_counts() -> None:
    blind = dataclasses.replace(D, measured=False, inflight=50)
    n = replicas_for(blind, 30.0, SEED, ttft_s=1.0, tbt_s=0.02, headroom=0.3)
    assert (n.replicas, n.reason) == (2, "ttft")  # 50 in flight / 40 slots, not the 30 req/s


def test_the_pools_declared_slots_cap_each_replicas_batch() -> None:
    """A pool whose replicas run ``max_running_requests: 4`` (``capacity:``) is planned with 4
    slots, whatever the TBT budget would allow, and needs more replicas for it."""
    kw = {"ttft_s": 10.0, "tbt_s": 0.02, "headroom": 0.3}
    free = replicas_for(D, 20, SEED, **kw)
    capped = replicas_for(D, 20, SEED, slots=4, **kw)
    assert (free.slots, capped.slots) == (40, 4)
    assert capped.reason == "slots" and capped.replicas > free.replicas
    assert replicas_for(D, 20, SEED, slots=400, **kw) == free  # a cap above c changes nothing
