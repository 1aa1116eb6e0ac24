"""The canary watch without network: p95 from buckets, the verdict, the hold time, weight
overrides on snapshots, the translation's split and forced routes, metrics page parsing, and the
watcher's rollback on fake pages."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry

from controlplane.canary import (
    CanaryWatcher,
    Guard,
    OverrideCache,
    Sample,
    apply_weights,
    judge,
    p95,
)
from controlplane.canary.judge import VersionCounts
from controlplane.canary.sample import gateway_counts, replica_histograms
from controlplane.translate import render
from controlplane.xds.snapshot import Snapshot
from policy import load_policy_text
from policy.canary import CanaryRollback
from policy.phases import CANARY_HEADER

INF = math.inf
RULES = CanaryRollback(min_requests=5, max_error_rate=0.1, max_ttft_ratio=2.0, window=10.0)


def test_p95_is_the_bound_of_the_bucket_holding_it() -> None:
    assert p95(((0.1, 90.0), (0.5, 96.0), (INF, 100.0))) == 0.5
    assert p95(((0.1, 1.0), (0.5, 1.0), (INF, 100.0))) == 0.5  # +Inf: the largest finite bound
    assert p95(((0.1, 0.0), (INF, 0.0))) is None


def counts(responses: float, errors: float = 0, ttft: tuple = ()) -> VersionCounts:
    return VersionCounts(responses, errors, ttft, ())


def test_judge_needs_evidence_then_flags_errors_and_latency() -> None:
    old = Sample(0.0, {"canary": counts(0), "baseline": counts(0)})
    few = Sample(1.0, {"canary": counts(4, 4), "baseline": counts(10)})
    assert judge(few, old, RULES) is None  # 4 < min_requests
    bad = Sample(1.0, {"canary": counts(10, 2), "baseline": counts(10)})
    v = judge(bad, old, RULES)
    assert v is not None and v.reason == "error_rate" and v.canary == pytest.approx(0.2)
    fast = ((0.1, 10.0), (1.0, 10.0), (INF, 10.0))
    slow = ((0.1, 0.0), (1.0, 10.0), (INF, 10.0))
    lat = Sample(1.0, {"canary": counts(10, 0, slow), "baseline": counts(10, 0, fast)})
    v = judge(lat, old, RULES)
    assert v is not None and v.reason == "ttft" and v.canary == 1.0 and v.limit == 0.2
    ok = Sample(1.0, {"canary": counts(10, 0, fast), "baseline": counts(10, 0, fast)})
    assert judge(ok, old, RULES) is None


def test_the_guard_rolls_back_only_after_sustain_and_over_the_window() -> None:
    g = Guard(CanaryRollback(min_requests=1, max_error_rate=0.1, window=10.0, sustain=2.0))
    g.observe(Sample(0.0, {"canary": counts(0)}))
    assert g.observe(Sample(1.0, {"canary": counts(10, 5)})) is None  # breach starts
    assert g.observe(Sample(2.0, {"canary": counts(20, 10)})) is None
    assert g.observe(Sample(3.0, {"canary": counts(30, 15)})) is not None  # held for 2 s
    g2 = Guard(CanaryRollback(min_requests=1, max_error_rate=0.1, window=2.0))
    g2.observe(Sample(0.0, {"canary": counts(0)}))
    g2.observe(Sample(1.0, {"canary": counts(10, 10)}))  # old errors...
    for t in range(2, 6):
        g2.observe(Sample(float(t), {"canary": counts(10 + 10 * t, 10)}))
    assert g2.last is None  # ...left the 2 s window


POLICY = """
version: 1
filters: {address: 127.0.0.1:18082, metrics_port: 19102}
pools:
  chat:
    models: [m1]
    endpoints: [127.0.0.1:30000]
    canary: {endpoints: [127.0.0.1:30001], weight: 25, force_tenants: [acme]}
gateways:
  edge:
    routes:
      - {name: llm, pool: chat, filters: {plugins: [identity, canary, usage]}}
tiers:
  std: {max_tokens: 64}
tenants:
  acme: {tier: std, api_keys: [acme-key-1234]}
"""


def routes_of(snapshot: Snapshot) -> list:
    return [r for rc in snapshot.of_type(render.ROUTE).values() for vh in rc.virtual_hosts
            for r in vh.routes]  # fmt: skip


def test_translation_splits_by_weight_and_forces_by_header() -> None:
    res = render.render(load_policy_text(POLICY))["edge"]
    assert "pool_chat_canary" in res[render.CLUSTER] and "pool_chat_canary" in res[render.ENDPOINT]
    snap = Snapshot("v1", res)
    main = next(r for r in routes_of(snap) if r.name == "llm")
    split = {c.name: c.weight.value for c in main.route.weighted_clusters.clusters}
    assert split == {"pool_chat": 75, "pool_chat_canary": 25}
    assert main.route.weighted_clusters.use_hash_policy.value
    forced = next(r for r in routes_of(snap) if r.name == "llm/canary")
    assert forced.route.cluster == "pool_chat_canary"
    assert forced.match.headers[-1].name == CANARY_HEADER
    rolled = apply_weights(snap, {"chat": 0})
    main = next(r for r in routes_of(rolled) if r.name == "llm")
    assert {c.name: c.weight.value for c in main.route.weighted_clusters.clusters} == {
        "pool_chat": 100, "pool_chat_canary": 0}  # fmt: skip
    assert rolled.version != snap.version and apply_weights(snap, {}) is snap


GATEWAY = """# TYPE tokenweir_filters_version_responses_total counter
tokenweir_filters_version_responses_total{pool="chat",version="canary",code="2xx"} 3.0
tokenweir_filters_version_responses_total{pool="chat",version="canary",code="5xx"} 7.0
tokenweir_filters_version_responses_total{pool="chat",version="baseline",code="2xx"} 10.0
tokenweir_filters_version_responses_total{pool="other",version="canary",code="5xx"} 99.0
"""
REPLICA = """# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="m1"} 2.0
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="m1"} 4.0
sglang:time_to_first_token_seconds_count{model_name="m1"} 4.0
sglang:time_to_first_token_seconds_sum{model_name="m1"} 1.0
"""


def test_metrics_pages_parse() -> None:
    assert gateway_counts([GATEWAY, GATEWAY], "chat") == {
        "canary": (20.0, 14.0), "baseline": (20.0, 0.0)}  # fmt: skip
    ttft, tbt = replica_histograms([REPLICA, REPLICA])
    assert ttft == ((0.1, 4.0), (INF, 8.0)) and tbt == ()


async def test_the_watcher_rolls_back_publishes_and_reports() -> None:
    policy = load_policy_text(
        POLICY.replace("weight: 25", "weight: 25, rollback: {min_requests: 5}")
    )
    cache = OverrideCache()
    cache.set_snapshot("edge", Snapshot("v1", render.render(policy)["edge"]))
    pages = {"127.0.0.1:19102": "", "127.0.0.1:30000": REPLICA, "127.0.0.1:30001": REPLICA}

    async def fetch(endpoint: str, timeout: float) -> str:
        return pages[endpoint]

    now = [0.0]
    registry = CollectorRegistry()
    w = CanaryWatcher(cache, fetch, clock=lambda: now[0], wall=lambda: 5.0, registry=registry)
    w.configure(policy)
    await w.check_once()
    pages["127.0.0.1:19102"] = GATEWAY
    now[0] = 1.0
    await w.check_once()
    status = w.status()["chat"]
    assert status["state"] == "rolled_back" and status["weight"] == 0
    assert "error_rate" in status["reason"]
    assert registry.get_sample_value("tokenweir_canary_weight", {"pool": "chat"}) == 0
    assert registry.get_sample_value(
        "tokenweir_canary_rollbacks_total", {"pool": "chat", "reason": "error_rate"}) == 1  # fmt: skip
    snap = cache.get("edge")
    assert snap is not None
    main = next(r for r in routes_of(snap) if r.name == "llm")
    assert {c.name: c.weight.value for c in main.route.weighted_clusters.clusters}[
        "pool_chat_canary"
    ] == 0
    w.configure(policy)  # the same policy again: the rollback holds
    assert w.status()["chat"]["state"] == "rolled_back"
    w.configure(load_policy_text(POLICY.replace("weight: 25", "weight: 10")))  # a new decision
    assert w.status()["chat"] == {**w.status()["chat"], "state": "active", "weight": 10}
