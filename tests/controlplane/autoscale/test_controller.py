"""The control plane's autoscaler on a fake clock: pages in → desired count and metrics out."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from controlplane.autoscale import Autoscaler
from policy import load_policy_text
from poolstate import PoolState, PoolSummary, ReplicaState
from poolstate.valley import RunnerWord

POLICY = """
version: 1
admission: {interactive: {ttft_budget: 2s}}
pools:
  chat:
    models: [m]
    endpoints: [127.0.0.1:9001, 127.0.0.1:9002]
    autoscale:
      profile: seed-2k
      min_replicas: 1
      max_replicas: 4
      tbt_budget: 20ms
      interval: 1s
      window: 5s
      scale_up_cooldown: 0s
  plain:
    models: [n]
    endpoints: [127.0.0.1:9003]
"""


# POLICY with a batch API and runner filling the autoscaled pool ``chat``
BATCH_POLICY = (
    POLICY
    + """
filters: {}
services:
  batch-api: {endpoints: [127.0.0.1:9004]}
gateways:
  edge:
    routes:
      - {name: jobs, match: {prefix: /v1/batches}, service: batch-api, filters: {plugins: [
          {name: identity, settings: {forward_authorization: true}}]}}
      - name: lines
        match: {prefix: /v1/, headers: {x-batch-line: "1"}}
        pool: chat
        filters: {plugins: [identity, idempotency]}
batch: {service: batch-api, gateway: edge, pool: chat}
"""
)


def _page(finished: float, running: float, prompt: float, generated: float) -> str:
    return (
        f'sglang:num_requests_total{{model_name="m"}} {finished}\n'
        f'sglang:prompt_tokens_total{{model_name="m"}} {prompt}\n'
        f'sglang:generation_tokens_total{{model_name="m"}} {generated}\n'
        f"sglang:cached_tokens_total 0\n"
        f"sglang:num_running_reqs {running}\nsglang:num_queue_reqs 0\n"
    )


def test_pages_in_desired_count_and_metrics_out(tmp_path: Path) -> None:
    now = [0.0]
    reg = CollectorRegistry()
    a = Autoscaler(clock=lambda: now[0], registry=reg)
    a.configure(load_policy_text(POLICY, str(tmp_path / "p.yaml")))
    assert set(a.pools) == {"chat"} and a.desired("chat") == 2  # starts at what serves
    state = PoolState(
        1, 0.0,
        {"chat": PoolSummary({"127.0.0.1:9001": ReplicaState(0.1), "127.0.0.1:9002":
                              ReplicaState(2.0, stale=True)})},
    )  # fmt: skip
    a.on_state(state)
    # 60 req/s of 500-token prompts and 200-token answers, split over the two replicas
    for t in range(0, 12):
        now[0] = float(t)
        done = 60.0 * t / 2
        for ep in ("127.0.0.1:9001", "127.0.0.1:9002"):
            a.tap(ep, _page(done, 0, done * 500, done * 200))
        a.tick()
    assert a.desired("chat") == 4
    labels = {"pool": "chat", "reason": "max"}
    assert reg.get_sample_value("tokenweir_pool_desired_replicas", labels) == 4
    assert reg.get_sample_value("tokenweir_pool_replicas", {"pool": "chat"}) == 1
    assert reg.get_sample_value("tokenweir_pool_needed_replicas", {"pool": "chat"}) > 4
    rate = reg.get_sample_value("tokenweir_pool_arrival_rate", {"pool": "chat", "kind": "now"})
    assert abs(rate - 60.0) < 1e-6
    body = a.to_json()["pools"]["chat"]
    assert body["desired"] == 4 and body["reason"] == "max" and body["serving"] == 1
    # a reload with a lower bound holds it at once
    a.configure(load_policy_text(POLICY.replace("max_replicas: 4", "max_replicas: 3"), "p.yaml"))
    now[0] = 12.0
    a.tick()
    assert a.desired("chat") == 3
    assert reg.get_sample_value("tokenweir_pool_desired_replicas", labels) == 3
    # no load any more: down to min after the window; the old reason's series is gone
    for t in range(13, 90):
        now[0] = float(t)
        for ep in ("127.0.0.1:9001", "127.0.0.1:9002"):
            a.tap(ep, _page(330.0, 0, 330 * 500, 330 * 200))
        a.tick()
    assert a.desired("chat") == 1
    assert reg.get_sample_value("tokenweir_pool_desired_replicas", labels) is None
    assert reg.get_sample_value("tokenweir_pool_desired_replicas", {**labels, "reason": "min"}) == 1


def test_replicas_starting_reach_the_published_pool_state(tmp_path: Path) -> None:
    """An actor's starting replicas go to every listener (the pool scraper): issue 42 part 3."""
    a = Autoscaler(clock=lambda: 0.0, registry=CollectorRegistry())
    a.configure(load_policy_text(POLICY, str(tmp_path / "p.yaml")))
    heard: list[tuple[str, int, float | None]] = []
    a.follow_starting(lambda pool, count, ready_in: heard.append((pool, count, ready_in)))
    a.set_starting("chat", 2, 12.5)
    a.set_starting("chat", 0)
    assert heard == [("chat", 2, 12.5), ("chat", 0, None)]
    assert a.pools["chat"].starting == 0


def _fill(a: Autoscaler, now: list[float], runner: bool) -> None:
    """12 s of a pool whose slots a batch runner fills: its 58 lines/s beside 2 interactive
    requests/s (500-token prompts, 200-token answers), 40 of its lines at the replicas."""
    eps = ("127.0.0.1:9001", "127.0.0.1:9002")
    words: dict[str, RunnerWord] = {}
    a.valley = lambda pool: words if runner and pool == "chat" else {}
    for t in range(0, 12):
        now[0] = float(t)
        lines, inter = 58.0 * t, 2.0 * t
        words["runner-0"] = RunnerWord(40, 0.0, int(lines), int(lines * 500), int(lines * 200))
        done = (lines + inter) / 2
        for ep in eps:
            a.tap(ep, _page(done, 20 + 1, done * 500, done * 200))
        a.tick()


def test_a_batch_runners_lines_do_not_buy_replicas(tmp_path: Path) -> None:
    """A job fills whatever slots it finds: counted as demand, its lines asked here for every
    replica up to max_replicas (and would fill those too). With the runners' words
    (poolstate/valley.py) the pool is planned for the interactive requests alone."""
    policy = load_policy_text(POLICY, str(tmp_path / "p.yaml"))
    plain_now, valley_now = [0.0], [0.0]
    plain = Autoscaler(clock=lambda: plain_now[0], registry=CollectorRegistry())
    plain.configure(policy)
    _fill(plain, plain_now, runner=False)
    assert plain.desired("chat") == 4  # the batch bought every replica it could
    valley = Autoscaler(clock=lambda: valley_now[0], registry=CollectorRegistry())
    valley.configure(policy)
    _fill(valley, valley_now, runner=True)
    assert valley.desired("chat") <= 2  # what serves now, or fewer
    assert valley.to_json()["pools"]["chat"]["forecast_rps"] == pytest.approx(2.0, abs=0.3)


def test_the_runners_words_are_read_for_the_autoscaled_batch_pool(tmp_path: Path) -> None:
    text = BATCH_POLICY
    policy = load_policy_text(text, str(tmp_path / "p.yaml"))
    assert Autoscaler.valley_pools(policy) == ("chat",)
    no_runner = load_policy_text(
        text.replace("pool: chat}\n", "pool: chat, runner: {replicas: 0}}\n"), "p.yaml"
    )
    assert Autoscaler.valley_pools(no_runner) == ()
    not_scaled = load_policy_text(text.replace("pool: chat}", "pool: plain}").replace(
        "        pool: chat\n", "        pool: plain\n"), "p.yaml")  # fmt: skip
    assert Autoscaler.valley_pools(not_scaled) == ()
