"""Dashboard rows from the policy and the totals, and the overview document."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from controlplane.dashboard.api import Dashboard
from controlplane.dashboard.collector import Source
from controlplane.dashboard.summary import Totals
from controlplane.dashboard.view import (
    binding,
    lane_rows,
    recent_rejections,
    sources_from_policy,
    tenant_rows,
    with_windows,
)
from policy.loader import load_policy_text
from policy.servers import Replicas
from quota.reader import WindowUsage

POLICY = """
version: 1
ratelimit: {address: 127.0.0.1:7001, metrics_port: 7100, replicas: 2}
filters: {address: 127.0.0.1:7002, metrics_port: 7200, processes: 3}
pools:
  chat: {models: [m1], endpoints: [127.0.0.1:9001]}
gateways:
  edge:
    listen: 127.0.0.1:10000
    routes: [{name: llm, pool: chat, rate_limit: {enabled: true}, filters: {plugins: [identity, tokens, usage]}}]
tiers:
  free: {quotas: {tokens: {per_day: 1000, per_minute: 100}}}
  pro: {quotas: {tokens: {burst: 500, refill_per_second: 5}}}
tenants:
  acme: {tier: free}
  bigco: {tier: free, quotas: {tokens: {per_month: 90000}}}
  solo: {tier: pro}
"""


def _policy() -> Any:
    return load_policy_text(POLICY, "mesh.yaml")


def test_sources_are_every_worker_of_both_services() -> None:
    assert sources_from_policy(_policy()) == [
        Source("filters#0", "127.0.0.1:7200"),
        Source("filters#1", "127.0.0.1:7201"),
        Source("filters#2", "127.0.0.1:7202"),
        Source("ratelimit#0", "127.0.0.1:7100"),
        Source("ratelimit#1", "127.0.0.1:7101"),
    ]


def test_sources_are_every_worker_of_every_replica() -> None:
    policy = dataclasses.replace(_policy(), replicas=Replicas(filters=2, ratelimit=2))
    assert sources_from_policy(policy) == [
        Source("filters#0.0", "127.0.0.1:7200"),
        Source("filters#0.1", "127.0.0.1:7201"),
        Source("filters#0.2", "127.0.0.1:7202"),
        Source("filters#1.0", "127.0.0.1:7203"),
        Source("filters#1.1", "127.0.0.1:7204"),
        Source("filters#1.2", "127.0.0.1:7205"),
        Source("ratelimit#0.0", "127.0.0.1:7100"),
        Source("ratelimit#0.1", "127.0.0.1:7101"),
        Source("ratelimit#1.0", "127.0.0.1:7102"),
        Source("ratelimit#1.1", "127.0.0.1:7103"),
    ]


def test_tenant_rows_use_own_quota_then_tier_and_sort_by_use() -> None:
    t = Totals(
        tokens={("acme", "prompt"): 40, ("acme", "completion"): 60, ("acme", "cached"): 8},
        retry_count={"solo": 2},
        retry_sum={"solo": 7},
    )
    rows = tenant_rows(_policy(), t)
    assert [r["tenant"] for r in rows] == ["acme", "solo", "bigco"]
    acme, solo, bigco = rows
    assert acme["since_start"] == {
        "prompt_tokens": 40, "completion_tokens": 60, "cached_tokens": 8, "tokens": 100
    }  # fmt: skip
    # not read from Redis: the policy's budget, nothing claimed about its use
    assert acme["budget"] == {"window": "per_day", "limit": 1000, "used": None, "remaining": None}
    assert bigco["budget"]["window"] == "per_month" and bigco["budget"]["limit"] == 90000
    assert solo["budget"] == {"window": "bucket", "limit": 500, "used": None, "remaining": None,
                              "refill_per_second": 5}  # fmt: skip
    assert acme["windows"] is None
    assert solo["rejections"] == 2 and solo["retry_after_mean_s"] == 3.5
    assert acme["retry_after_mean_s"] is None
    assert len(tenant_rows(_policy(), t, limit=1)) == 1


def test_with_windows_shows_the_longest_window_as_redis_counts_it() -> None:
    rows = tenant_rows(_policy(), Totals(tokens={("acme", "prompt"): 900}))
    read = {
        "acme": [
            WindowUsage("per_minute", 100, 30, 70, 12.0, 0.0),
            WindowUsage("per_day", 1000, 130, 870, 3600.0, 0.0),
        ],
        "solo": [WindowUsage("bucket", 500, 50, 450, 10.0, 5.0)],
    }
    acme, bigco, solo = with_windows(rows, read)  # by tokens since start, then name
    # 130 spent in this day, not the 900 since start
    assert acme["budget"] == {"window": "per_day", "limit": 1000, "used": 130, "remaining": 870,
                              "resets_in_s": 3600.0}  # fmt: skip
    assert [w["window"] for w in acme["windows"]] == ["per_minute", "per_day"]
    assert acme["since_start"]["tokens"] == 900
    assert solo["budget"]["used"] == 50 and solo["budget"]["refill_per_second"] == 5.0
    assert bigco["budget"]["used"] is None  # not read


def test_lane_rows_count_the_ladders_sheds() -> None:
    t = Totals(
        admitted={("chat", "interactive"): 4},
        shed={("chat", "batch"): 1},
        ladder_shed={("chat", "batch"): 5},
    )
    assert lane_rows(t) == [
        {"pool": "chat", "lane": "batch", "admitted": 0, "queued": 0, "shed": 6,
         "shed_by_admission": 1, "shed_by_ladder": 5},
        {"pool": "chat", "lane": "interactive", "admitted": 4, "queued": 0, "shed": 0,
         "shed_by_admission": 0, "shed_by_ladder": 0},
    ]  # fmt: skip


def test_the_binding_limit_is_the_one_closest_to_refusing() -> None:
    # the case: a 2,000-token bucket drawn down, 1% of the day's 200,000 spent
    bucket = WindowUsage("bucket", 2000, 1990, 10, 99.5, 20.0)
    day = WindowUsage("per_day", 200000, 2400, 197600, 40000.0, 0.0)
    b = binding([day, bucket])
    assert b is not None and (b["quota"], b["window"], b["used"], b["limit"]) == (
        "tokens", "bucket", 1990, 2000)  # fmt: skip
    assert b["use"] == 0.995 and b["refill_per_second"] == 20.0
    # money: shown in dollars; a shadow limit never binds
    usd = WindowUsage("per_day", 1_000_000, 999_000, 1_000, 10.0, 0.0, "usd")
    shadow = WindowUsage("per_minute", 10, 10, 0, 5.0, 0.0, "requests", shadow=True)
    b = binding([day, bucket, usd, shadow])
    assert b is not None and (b["quota"], b["used"], b["limit"]) == ("usd", 0.999, 1.0)
    assert binding([shadow]) is None


def test_recent_rejections_count_since_the_oldest_recent_round() -> None:
    rows = [{"tenant": "acme"}, {"tenant": "solo"}]
    old, new = Totals(retry_count={"acme": 3}), Totals(retry_count={"acme": 10, "solo": 2})
    acme, solo = recent_rejections(rows, new, (100.0, old), 400.0)
    assert (acme["recent_429"], acme["recent_s"]) == (7, 300.0) and solo["recent_429"] == 2
    assert recent_rejections(rows, new, None, 400.0)[0]["recent_429"] is None


class _NoFetch:
    async def metrics(self, endpoint: str, timeout_s: float, path: str = "/metrics") -> str:
        raise AssertionError("not scraped in this test")


def test_overview_document_has_every_section() -> None:
    d = Dashboard(
        _NoFetch(),
        pools=lambda: {"version": 3, "pools": {}},
        nodes=lambda: [{"node": "edge-0"}],
        wall_clock=lambda: 1000.0,
    )
    d.on_policy(_policy())
    o = asyncio.run(d.overview(tenants=2))
    assert o["api_version"] == 3 and o["time"] == 1000.0
    assert o["quota_source"] is None and o["quota_error"] is None  # no Redis named
    assert o["pools"]["version"] == 3 and o["envoys"] == [{"node": "edge-0"}]
    assert [t["tenant"] for t in o["tenants"]] == ["acme", "bigco"] and o["tenant_count"] == 3
    assert [s["name"] for s in o["sources"]][:1] == ["filters#0"]
    assert o["sources"][0]["ok"] is False and o["series"] == []  # not scraped yet
    assert [p["pool"] for p in o["pool_status"]] == ["chat"]
    assert o["pool_status"][0]["per_s"] is None  # no two rounds to take a rate between
