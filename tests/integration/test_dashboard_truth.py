"""The dashboard's numbers agree with the services' own ``/metrics`` and Envoy's stats, and
with what the clients saw (issue 38): ``tokenweir up`` on the example mesh with its pool held to
4 slots per replica (real Envoy, filter server, rate-limit service, Redis, emulators at their
real speed), the README's burst (pro interactive, free batch: 200s, admission's and the
ladder's 503s), then the free tenant past its token bucket (429s). Nobody reads the API while
the traffic runs: the history is the control plane's own."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from policy import load_policy
from tests.integration.example_mesh import example_policy
from tests.integration.test_e2e_first_contact import burst, call, report
from tests.integration.up_process import start_up, stop_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

STORY = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "Write a story."}],
         "max_tokens": 256}  # fmt: skip


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """``name``'s samples in a Prometheus text, read with a regex (not the dashboard's parser)."""
    out = []
    for m in re.finditer(rf"^{name}(?:\{{(.*?)\}})? (\S+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        out.append((labels, float(m.group(2))))
    return out


def ladder_step(text: str) -> float:
    return max(
        v for lb, v in samples(text, "tokenweir_filters_ladder_step") if lb["pool"] == "chat"
    )


def envoy_stats(admin: str) -> dict[str, int]:
    """Envoy's plain ``/stats`` (``name: value``), the counters of the pools' clusters."""
    out = {}
    for line in get(f"{admin}/stats?filter=^cluster\\.pool_").splitlines():
        name, _, value = line.partition(": ")
        if value.isdigit():
            out[name] = int(value)
    return out


def test_the_dashboard_agrees_with_metrics_and_with_the_clients(tmp_path: Path) -> None:
    # the pool's three replicas (one alone stays saturated: the ladder's clamp would keep the free
    # tenant under its bucket), its ladder and fallback, the tenants; not the batch API, sidecar
    text, gw = example_policy(time_scale=1.0, batch=False, sidecar=False)
    text = text.replace("    # capacity: {max_running_requests: 64}",
                        "    capacity: {max_running_requests: 4}  #")  # fmt: skip
    text = text.replace("message_timeout: 200ms", "message_timeout: 2s")  # a loaded 2-core box
    text = text.replace("timeout: 50ms", "timeout: 1s")
    (tmp_path / "mesh.yaml").write_text(text)
    metrics = load_policy(tmp_path / "mesh.yaml").control_plane.metrics
    api = f"http://{metrics}/api/v1/overview"
    url = f"http://127.0.0.1:{gw}/v1/chat/completions"
    proc, banner = start_up(tmp_path / "mesh.yaml", tmp_path / "run", extra_args=("--fresh",))
    try:
        assert "tokenweir up: ready" in banner, banner
        assert f"dashboard       http://{metrics}/dashboard/" in banner  # `up` names the page
        filters = re.search(r"filters +grpc://\S+ +metrics (http://\S+/metrics)", banner)
        ratelimit = re.search(r"ratelimit +grpc://\S+ +metrics (http://\S+/metrics)", banner)
        admin = re.search(r"envoy gateway +edge: \S+ +admin (http://\S+)", banner)
        assert filters and ratelimit and admin, banner

        time.sleep(3.0)  # the mesh idles a little, nobody reading the API
        started = time.time()
        outcomes = asyncio.run(burst(url, pro=40, free=8))
        seen = Counter(o.status for o in outcomes)
        deadline = time.monotonic() + 30  # the ladder leaves its shed step (batch: free)
        while time.monotonic() < deadline and ladder_step(get(filters.group(1))) >= 3:
            time.sleep(0.5)
        for _ in range(20):  # the free tenant past its token bucket
            status, _, _ = call(url, "tw-demo-free-key", STORY)
            seen[status] += 1
            if status == 429:
                break
        assert seen[200] and seen[503] and seen[429], (seen, report(outcomes))

        def agree() -> tuple[bool, Any]:
            o = json.loads(get(api))
            f, r, e = get(filters.group(1)), get(ratelimit.group(1)), envoy_stats(admin.group(1))
            pools = {p["pool"]: p for p in o["pool_status"]}
            answered = Counter[str]()
            for p in pools.values():
                answered.update({k: v for k, v in p["answers"].items() if k != "requests"})
            # the clients' statuses, class by class, as the dashboard counts them
            want = {"2xx": seen[200], "429": seen[429], "503": seen[503], "4xx": 0, "5xx": 0}
            checks = {"clients": (dict(answered), want)}
            # Envoy's own counters of the pool's route cluster
            # (a request the ladder sent to the fallback pool is answered through the same
            # route cluster: the dashboard counts it under the pool that served it)
            checks["envoy 2xx"] = (
                sum(p["answers"]["2xx"] for p in pools.values()),
                # the route's cluster (pool_chat_with_fallback), not its `.external.` twin
                sum(v for k, v in e.items() if re.fullmatch(r"cluster\.pool_chat[^.]*\.upstream_rq_2xx", k)),
            )  # fmt: skip
            lanes = {f"{x['pool']}/{x['lane']}": x for x in o["lanes"]}

            def by_lane(text: str, name: str) -> dict[str, int]:
                c = Counter[str]()
                for lb, v in samples(text, name):
                    c[f"{lb['pool']}/{lb['lane']}"] += int(v)
                return {k: v for k, v in c.items() if v}

            for field, name in (
                ("admitted", "tokenweir_admission_admitted_total"),
                ("shed_by_admission", "tokenweir_admission_shed_total"),
                ("shed_by_ladder", "tokenweir_filters_ladder_shed_total"),
            ):
                got = {k: x[field] for k, x in lanes.items() if x[field]}
                checks[field] = (got, by_lane(f, name))
            # every 503 the clients got was a shed, admission's or the ladder's, per lane
            checks["sheds"] = (sum(x["shed"] for x in lanes.values()), seen[503])
            (step,) = [v for lb, v in samples(f, "tokenweir_filters_ladder_step")
                       if lb["pool"] == "chat"]  # fmt: skip
            checks["ladder step"] = (pools["chat"]["ladder_step"], int(step))
            (limit,) = [v for lb, v in samples(f, "tokenweir_admission_limit")
                        if lb["pool"] == "chat"]  # fmt: skip
            checks["admission capacity"] = (pools["chat"]["admission_capacity"], limit)
            free = next(t for t in o["tenants"] if t["tenant"] == "demo-free")
            told = sum(v for lb, v in samples(r, "tokenweir_ratelimit_retry_after_seconds_count")
                       if lb.get("tenant") == "demo-free")  # fmt: skip
            checks["free 429s"] = (free["rejections"], int(told))
            checks["free recent 429s"] = (free["recent_429"], int(told))
            ok = all(a == b for a, b in checks.values())
            return ok, {"checks": checks, "free": free, "pools": pools}

        deadline = time.monotonic() + 20  # the collector's next rounds; the ladder's dwell
        ok, last = agree()
        while not ok and time.monotonic() < deadline:
            time.sleep(0.5)
            ok, last = agree()
        assert ok, json.dumps(last, indent=1, default=str)
        assert last["checks"]["sheds"][0] > 0  # the burst was shed, and the lanes show it
        # the free tenant was refused by a bucket (its tokens', or its requests' after the
        # loop's requests: whichever is closer to refusing): that limit binds, not the day's 1%
        binding = last["free"]["binding"]
        assert binding["quota"] in ("tokens", "requests"), last["free"]
        assert binding["window"] == "bucket", last["free"]
        assert binding["use"] > 0.5 and last["free"]["budget"]["window"] == "per_day"
        assert last["free"]["budget"]["used"] / 200000 < 0.05

        # the history: points from before anybody asked, and "since" returns only newer ones
        o = json.loads(get(f"{api}?points=3600"))
        series = o["series"]
        assert o["interval_s"] == 1.0 and len(series) >= 5, series
        assert series[0]["t"] < started  # collected before the traffic, with nobody reading
        assert max(p["answers_per_s"] for p in series) > 0
        assert max(p["errors_per_s"] for p in series) > 0
        newer = json.loads(get(f"{api}?since={series[-2]['t']}"))["series"]
        assert newer and all(p["t"] > series[-2]["t"] for p in newer)
    finally:
        stop_up(proc)
