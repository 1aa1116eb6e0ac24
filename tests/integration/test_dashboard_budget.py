"""The dashboard's tenant budgets are the quota's own accounting (issue 13): through the example
mesh under ``tokenweir up`` (real Envoy, filter server, rate-limit service, Redis, emulators),
spend demo-free's tokens, then ``GET /api/v1/overview`` must say what Redis says for this window
(the day's counter; the bucket's capacity minus its level), show the bucket refilling, follow a
live quota edit, and drop to zero on ``tokenweir quota reset`` while the since-start totals
(labelled so) keep counting."""

from __future__ import annotations

import json
import math
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry

from controlplane.dashboard.quota import QuotaWindows
from policy import load_policy
from policy.loader import load_policy_text
from quota.keys import bucket_key, window_key
from tests.helpers import free_port
from tests.integration.example_mesh import example_policy
from tests.integration.test_e2e_first_contact import call
from tests.integration.test_up_state import cli
from tests.integration.up_process import mesh_redis_url, start_up, stop_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

HELLO = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 40}
BURST, RATE = 2000, 20  # demo-free's token bucket in examples/mesh.yaml (per_day: 200000)


def overview(metrics: object) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{metrics}/api/v1/overview", timeout=5) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def row(o: dict[str, Any], tenant: str) -> dict[str, Any]:
    (r,) = [t for t in o["tenants"] if t["tenant"] == tenant]
    return r


def windows(r: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {w["window"]: w for w in r["windows"]}


def redis_state(client: redis.Redis, tenant: str) -> tuple[int, float]:
    """(this day's counter, the bucket's level now) of the tenant's tokens quota, as stored."""
    day = int(time.time() // 86400)
    used = int(client.get(window_key(tenant, "tokens", "day", day)) or 0)
    tk, ts = client.hmget(bucket_key(tenant, "tokens"), "tk", "ts")
    if tk is None:
        return used, float(BURST)
    level = float(tk) + (time.time() * 1e6 - float(ts)) * RATE / 1e6
    return used, min(float(BURST), level)


def test_overview_budgets_follow_the_quota_in_redis(tmp_path: Path) -> None:
    # the tenants' budgets: one chat replica, no batch API, sidecar or fallback pool (fewer processes)
    text, gw = example_policy(replicas=1, batch=False, sidecar=False, fallback=False)
    text = text.replace("message_timeout: 200ms", "message_timeout: 2s")  # a loaded 2-core box
    text = text.replace("timeout: 50ms", "timeout: 1s")
    policy_path = tmp_path / "mesh.yaml"
    policy_path.write_text(text)
    metrics = load_policy(policy_path).control_plane.metrics
    url = f"http://127.0.0.1:{gw}/v1/chat/completions"
    proc, banner = start_up(policy_path, tmp_path / "run", extra_args=("--fresh",))
    try:
        assert "tokenweir up: ready" in banner, banner
        client = redis.Redis.from_url(mesh_redis_url(policy_path))
        o = overview(metrics)
        assert o["api_version"] == 3 and o["quota_source"] == "redis" and o["quota_error"] is None
        free = row(o, "demo-free")
        assert free["budget"]["window"] == "per_day" and free["budget"]["used"] == 0
        assert windows(free)["bucket"]["used"] == 0

        for i in range(4):
            status, _, body = call(url, "tw-demo-free-key", {**HELLO, "user": f"u{i}"})
            assert status == 200, body

        # settled (the stream-done call is asynchronous): the day's counter stops moving
        deadline = time.monotonic() + 20
        while True:
            spent, level = redis_state(client, "demo-free")
            free = row(overview(metrics), "demo-free")
            again, level2 = redis_state(client, "demo-free")
            if spent == again and free["budget"]["used"] == spent and free["since_start"]["tokens"]:
                break
            assert time.monotonic() < deadline, (spent, again, free)
            time.sleep(0.3)
        assert spent > 0
        b = free["budget"]
        assert (b["window"], b["limit"], b["remaining"]) == ("per_day", 200000, 200000 - spent)
        assert 0 < b["resets_in_s"] <= 86400
        bucket = windows(free)["bucket"]
        # capacity minus the level Redis holds (it refills 20/s between the two reads)
        assert BURST - math.ceil(level2) <= bucket["used"] <= BURST - math.floor(level) + 1
        assert bucket["used"] > 0 and bucket["refill_per_second"] == RATE

        time.sleep(2.0)  # the bucket refills 20 tokens a second; the day's window does not
        refilled = row(overview(metrics), "demo-free")
        assert windows(refilled)["bucket"]["used"] <= bucket["used"] - 30
        assert refilled["budget"]["used"] == spent

        # a live edit: the budget shown is the quota Redis enforces now
        done = cli("quota", "-c", str(policy_path), "set", "demo-free", "tokens.per_day=5000")
        assert done.returncode == 0, done.stderr
        edited = row(overview(metrics), "demo-free")
        assert edited["budget"]["limit"] == 5000 and edited["budget"]["used"] == spent
        assert edited["budget"]["remaining"] == 5000 - spent

        # counters reset: the window starts again; the since-start totals do not
        since = edited["since_start"]["tokens"]
        done = cli("quota", "-c", str(policy_path), "reset", "demo-free")
        assert done.returncode == 0, done.stderr
        reset = row(overview(metrics), "demo-free")
        assert reset["budget"]["used"] == 0 and windows(reset)["bucket"]["used"] == 0
        assert reset["since_start"]["tokens"] == since > 0
    finally:
        stop_up(proc)


async def test_an_unreachable_redis_is_reported_and_counted() -> None:
    """Redis down: the answer still comes, budgets without ``used``, the error named, counted."""
    text, _ = example_policy()
    registry = CollectorRegistry()
    quotas = QuotaWindows(f"redis://127.0.0.1:{free_port()}/0", registry=registry, timeout=0.2)
    quotas.on_policy(load_policy_text(text))
    try:
        windows, error = await quotas.read(["demo-free", "demo-pro"])
        assert windows == {} and error is not None and error.startswith("redis: "), error
        assert registry.get_sample_value("tokenweir_dashboard_quota_read_errors_total") == 1
    finally:
        await quotas.aclose()
