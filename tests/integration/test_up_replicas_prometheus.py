"""Prometheus scrapes every replica `tokenweir up --replicas` starts (issue 13): two of each
server (gateway Envoys, filter servers, rate-limit services, control planes) and two emulators;
Debian's prometheus must list every one of their /metrics endpoints as a target, all ``up``; and
each control plane's dashboard reads the tenants' budgets from the Redis ``up`` started."""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import free_port_block
from tests.integration.up_process import start_up, stop_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def policy_text() -> str:
    gw, xds, cpm, rl, rlm, fs, fsm, emu = (free_port_block(4) for _ in range(8))
    return f"""
version: 1
control_plane: {{xds: 127.0.0.1:{xds}, metrics: 127.0.0.1:{cpm}, debounce: 50ms}}
ratelimit: {{address: 127.0.0.1:{rl}, metrics_port: {rlm}, timeout: 1s}}
filters: {{address: 127.0.0.1:{fs}, metrics_port: {fsm}, message_timeout: 2s}}
pools:
  chat:
    models: [m]
    emulated: {{replicas: 2, profile: llama-3.1-8b-h100, base_port: {emu}, time_scale: 0.02}}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes:
      - name: chat
        match: {{prefix: /v1/}}
        pool: chat
        rate_limit: {{enabled: true}}
        filters: {{plugins: [identity, tokens, usage]}}
tiers:
  basic: {{quotas: {{tokens: {{burst: 100000, refill_per_second: 1000}}}}}}
tenants:
  acme: {{tier: basic, api_keys: [tw-acme-key]}}
"""


def test_prometheus_scrapes_every_replica_up_starts(tmp_path: Path) -> None:
    if shutil.which("prometheus") is None:
        pytest.skip("Debian's prometheus is not installed (scripts/ensure-system-deps.sh)")
    (tmp_path / "mesh.yaml").write_text(policy_text())
    replicas = "gateway=2,filters=2,ratelimit=2,controlplane=2"
    proc, banner = start_up(
        tmp_path / "mesh.yaml",
        tmp_path / "run",
        timeout=150,
        extra_args=("--fresh", "--replicas", replicas, "--scrape-interval", "1",
                    "--drain-timeout", "1"),
        prometheus=True,
    )  # fmt: skip
    try:
        assert "tokenweir up: ready" in banner, banner
        prom = re.search(r"prometheus +(http://\S+)", banner)
        assert prom is not None, banner
        # every /metrics endpoint up's banner names, and each Envoy's admin
        want = set(re.findall(r"metrics http://(127\.0\.0\.1:\d+)/metrics", banner))
        envoys = set(re.findall(r"admin http://(127\.0\.0\.1:\d+)", banner))
        # cp, rl, fs, emulators, and up's supervisor (the control planes are child processes)
        assert len(want) == 2 + 2 + 2 + 2 + 1 and len(envoys) == 2, banner
        deadline = time.monotonic() + 60
        while True:
            with urllib.request.urlopen(prom.group(1) + "/api/v1/targets", timeout=5) as r:
                active = json.loads(r.read())["data"]["activeTargets"]
            health = {t["labels"]["instance"]: t["health"] for t in active}
            if set(health) >= want | envoys and all(h == "up" for h in health.values()):
                break
            if time.monotonic() > deadline:
                bad = {t["scrapeUrl"]: t.get("lastError") for t in active if t["health"] != "up"}
                raise AssertionError(
                    f"missing {sorted((want | envoys) - set(health))}; not up: {bad}"
                )
            time.sleep(0.5)
        by_job: dict[str, int] = {}
        for t in active:
            by_job[t["labels"]["job"]] = by_job.get(t["labels"]["job"], 0) + 1
        assert by_job == {
            "controlplane": 3,  # 2 control planes and up's supervisor
            "ratelimit": 2,
            "filters": 2,
            "emulator": 2,
            "envoy": 2,
        }
        assert set(health) == want | envoys
        # each control plane's dashboard reads the tenants' budgets from up's Redis
        planes = re.findall(
            r"control plane#\d+ .*metrics http://(127\.0\.0\.1:\d+)/metrics", banner
        )
        assert len(planes) == 2, banner
        for plane in planes:
            with urllib.request.urlopen(f"http://{plane}/api/v1/overview", timeout=5) as r:
                o = json.loads(r.read())
            assert (o["quota_source"], o["quota_error"]) == ("redis", None), plane
            (acme,) = o["tenants"]
            assert acme["budget"]["used"] == 0 and acme["budget"]["limit"] == 100000
    finally:
        stop_up(proc, timeout=60)
