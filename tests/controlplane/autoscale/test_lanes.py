"""Arrivals by lane and the replicas each lane needs for its own TTFT budget."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from controlplane.autoscale import Autoscaler, Demand, replicas_for
from controlplane.autoscale.lanes import LaneDemand, LaneWindow, ordered, without_runners
from controlplane.dashboard.collector import ServiceCollector, Source
from controlplane.planner import profile_replica
from policy import load_policy_text

SEED = profile_replica("seed-2k")
D = Demand(prompt_mean=500.0, output_mean=200.0, measured=True)
BUDGETS = {"interactive": 0.22, "batch": 30.0}  # seed-2k's TTFT floor here: 170 ms


def test_lane_window_shares_over_the_window() -> None:
    w = LaneWindow(10.0)
    assert w.shares() == {}
    w.observe(0.0, {"interactive": 100.0, "batch": 50.0})
    w.observe(5.0, {"interactive": 130.0, "batch": 140.0})  # +30 and +90
    assert w.shares() == {"interactive": 0.25, "batch": 0.75}
    w.observe(20.0, {"interactive": 140.0, "batch": 140.0})  # the window slid: +10 and +0
    assert w.shares() == {"interactive": 1.0}
    w.observe(21.0, {"interactive": 5.0})  # a filter process restarted: counts from its new total
    w.observe(31.5, {"interactive": 5.0})
    assert w.shares() == {}


def test_ordered_puts_interactive_first_and_defaults_to_it() -> None:
    lanes = ordered({"batch": 3.0, "interactive": 1.0, "other": 4.0}, BUDGETS)
    assert lanes == (LaneDemand("interactive", 0.25, 0.22), LaneDemand("batch", 0.75, 30.0))
    assert ordered({}, BUDGETS) == (LaneDemand("interactive", 1.0, 0.22),)


def test_one_interactive_lane_is_the_planners_own_count() -> None:
    kw = {"tbt_s": 0.02, "headroom": 0.3}
    for rate in (5.0, 20.0, 60.0):
        alone = replicas_for(D, rate, SEED, ttft_s=0.22, **kw)
        lane = replicas_for(D, rate, SEED, ttft_s=0.22, lanes=ordered({}, BUDGETS), **kw)
        assert alone == lane and [x for x, _ in alone.lanes] == ["interactive"]


def test_batch_traffic_is_planned_against_its_own_budget() -> None:
    kw = {"tbt_s": 0.02, "headroom": 0.0, "ttft_s": 0.22}
    rate = 60.0
    # everything held to the interactive budget (what the planner did before lanes)
    all_interactive = replicas_for(D, rate, SEED, **kw)
    assert all_interactive.reason == "ttft"
    # three quarters of it is batch, with a 30 s budget: interactive waits only behind itself
    split = replicas_for(D, rate, SEED, lanes=ordered({"interactive": 1, "batch": 3}, BUDGETS),
                         **kw)  # fmt: skip
    assert (split.replicas, all_interactive.replicas) == (11, 15)  # 60 req/s: 10 is ρ = 0.9
    needs = dict(split.lanes)
    assert needs["batch"] <= needs["interactive"] <= split.replicas


def test_the_reason_names_the_lane_whose_budget_binds() -> None:
    kw = {"tbt_s": 0.02, "headroom": 0.0, "ttft_s": 10.0}
    tight_batch = {"interactive": 10.0, "batch": 0.25}  # a batch budget tighter than interactive's
    n = replicas_for(D, 60.0, SEED, lanes=ordered({"interactive": 1, "batch": 3}, tight_batch),
                     **kw)  # fmt: skip
    assert n.reason == "ttft_batch"
    assert dict(n.lanes)["batch"] == n.replicas > dict(n.lanes)["interactive"]


POLICY = """
version: 1
admission: {interactive: {ttft_budget: 220ms}, batch: {ttft_budget: 30s}}
pools:
  chat:
    models: [m]
    endpoints: [127.0.0.1:9001]
    autoscale:
      profile: seed-2k
      min_replicas: 1
      max_replicas: 40
      tbt_budget: 20ms
      headroom: 0
      interval: 1s
      window: 5s
      scale_up_cooldown: 0s
"""


def _page(done: float) -> str:
    return (
        f"sglang:num_requests_total {done}\nsglang:prompt_tokens_total {done * 500}\n"
        f"sglang:generation_tokens_total {done * 200}\nsglang:num_running_reqs 0\n"
    )


def _run(a: Autoscaler, now: list[float], batch_share: float) -> None:
    for t in range(12):
        now[0] = float(t)
        a.tap("127.0.0.1:9001", _page(60.0 * t))
        arrivals = 60.0 * t
        a.on_lanes(float(t), {
            ("chat", "interactive"): arrivals * (1 - batch_share),
            ("chat", "batch"): arrivals * batch_share, ("other", "batch"): 5.0 * t,
        })  # fmt: skip
        a.tick()


def test_controller_splits_the_pool_rate_by_admissions_lanes(tmp_path: Path) -> None:
    desired = {}
    for share in (0.0, 0.75):
        now = [0.0]
        reg = CollectorRegistry()
        a = Autoscaler(clock=lambda now=now: now[0], registry=reg)
        a.configure(load_policy_text(POLICY, str(tmp_path / "p.yaml")))
        _run(a, now, share)
        body = a.to_json()["pools"]["chat"]
        desired[share] = body["desired"]
        if share:
            assert body["lanes"]["batch"]["share"] == 0.75
            assert abs(body["lanes"]["batch"]["forecast_rps"] - 45.0) < 1.0
            assert body["lanes"]["interactive"]["needed"] < body["desired"] + 1
            rate = reg.get_sample_value(
                "tokenweir_pool_lane_arrival_rate", {"pool": "chat", "lane": "batch"}
            )
            assert rate is not None and abs(rate - 45.0) < 1.0
        else:
            assert body["lanes"]["interactive"]["share"] == 1.0
    assert desired[0.75] < desired[0.0]


async def test_the_collector_hands_each_round_to_its_followers() -> None:
    class Fetch:
        async def metrics(self, endpoint: str, timeout_s: float, path: str = "/metrics") -> str:
            return (
                'tokenweir_admission_admitted_total{pool="chat",lane="batch"} 7\n'
                'tokenweir_admission_shed_total{pool="chat",lane="batch",reason="queue_full"} 2\n'
                'tokenweir_admission_admitted_total{pool="chat",lane="interactive"} 4\n'
            )

    seen: list[dict[tuple[str, str], float]] = []
    c = ServiceCollector(Fetch(), clock=lambda: 1.0)
    c.configure([Source("filters#0", "127.0.0.1:1")])
    c.follow(lambda now, totals: seen.append(totals.lane_arrivals()))
    await c.scrape_once()
    assert seen == [{("chat", "batch"): 9.0, ("chat", "interactive"): 4.0}]


def test_the_runners_lines_leave_the_batch_lanes_share() -> None:
    """Admission counts a batch runner's lines in the batch lane; the pool's rate no longer
    holds them (demand.py), so neither may the shares: else a job filling the valleys made
    97% of the arrivals batch and interactive was planned for 3% of the rate left."""
    budgets = {"interactive": 2.0, "batch": 30.0}
    shares = {"interactive": 2 / 60, "batch": 58 / 60}
    only = ordered(without_runners(shares, 56 / 60), budgets)
    assert [(ld.lane, round(ld.share, 3)) for ld in only] == [("interactive", 0.5), ("batch", 0.5)]
    all_runner = ordered(without_runners(shares, 58 / 60), budgets)
    assert [(ld.lane, ld.share) for ld in all_runner] == [("interactive", 1.0)]
    assert without_runners(shares, 0.0) == shares
    assert without_runners({"interactive": 1.0}, 0.5) == {"interactive": 1.0}
