"""The online planner sizes a pool by its replicas' measured rates, not the profile's: two real
emulator processes on the same profile, one twice as slow as the policy says, loaded alike; the
planner reads their /metrics pages (the pages the pool scraper hands it) and plans with them."""

from __future__ import annotations

import asyncio
import itertools
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from controlplane.autoscale import Autoscaler, replicas_for
from controlplane.planner import profile_replica
from policy import load_policy_text
from tests.helpers import ChildProcess, free_port, wait_for_port

pytestmark = pytest.mark.integration

POLICY = """
version: 1
admission: {{interactive: {{ttft_budget: 2s}}}}
pools:
  chat:
    models: [m]
    endpoints: [127.0.0.1:{fast}, 127.0.0.1:{slow}]
    autoscale:
      profile: seed-2k
      time_scale: 2          # what the policy believes every replica runs at
      min_replicas: 1
      max_replicas: 50
      tbt_budget: 60ms
      interval: 1s
      window: 10s
      scale_up_cooldown: 0s
"""


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """Two seed-2k emulators: one at the policy's time scale 2, one at 4 (twice as slow)."""
    ports = (free_port(), free_port())
    children = []
    try:
        for port, scale in zip(ports, (2.0, 4.0), strict=True):
            argv = [sys.executable, "-m", "backends.emulator", "--port", str(port)]
            argv += ["--model", "m", "--profile", "seed-2k", "--time-scale", str(scale)]
            children.append(ChildProcess(argv, log=tmp_path / f"emu{port}.log"))
        for port in ports:
            wait_for_port(port, timeout=30)
        yield ports
    finally:
        for child in children:
            child.close()


async def _arrivals(http: aiohttp.ClientSession, url: str, rps: float, until: float) -> None:
    """Poisson arrivals (open loop, as traffic comes): 200-token prompts, 30-token answers."""
    rng = random.Random(url)
    sent: list[asyncio.Task[None]] = []

    async def one(i: int) -> None:
        words = " ".join(f"w{i}x{k}" for k in range(200))  # uncached: every word is new
        body = {"model": "m", "prompt": words, "max_tokens": 30, "stream": False}
        async with http.post(url + "/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()
            await r.read()

    for i in itertools.count():
        await asyncio.sleep(rng.expovariate(rps))
        if time.monotonic() >= until:
            break
        sent.append(asyncio.create_task(one(i)))
    await asyncio.gather(*sent)


async def test_planner_follows_measured_rates_not_profile(
    tmp_path: Path, replicas: tuple[int, int]
) -> None:
    fast, slow = replicas
    eps = [f"127.0.0.1:{fast}", f"127.0.0.1:{slow}"]
    reg = CollectorRegistry()
    a = Autoscaler(clock=time.monotonic, registry=reg)
    a.configure(load_policy_text(POLICY.format(fast=fast, slow=slow), str(tmp_path / "p.yaml")))
    async with aiohttp.ClientSession() as http:

        async def scrape() -> None:
            for ep in eps:
                async with http.get(f"http://{ep}/metrics") as r:
                    a.tap(ep, await r.text())

        await scrape()
        a.tick()
        before = a.to_json()["pools"]["chat"]["speed"]
        assert before["source"] == "profile" and before["decode"] == 2.0  # no samples yet
        until = time.monotonic() + 14.0
        # the same load on both: 3 requests per second each
        load = [asyncio.create_task(_arrivals(http, f"http://{ep}", 3.0, until)) for ep in eps]
        while time.monotonic() < until:
            await asyncio.sleep(0.5)
            await scrape()
            a.tick()
        await asyncio.gather(*load)
    body = a.to_json()["pools"]["chat"]
    speed = body["speed"]
    assert speed["source"] == "measured", speed
    f, s = speed["replicas"][eps[0]], speed["replicas"][eps[1]]
    assert f["source"] == s["source"] == "measured"
    # each replica's factor is its own time scale (the profile's times × 2 and × 4); a loaded
    # box stretches steps a little, never shortens them
    assert 1.6 <= f["decode"] <= 3.0 and 3.2 <= s["decode"] <= 6.0, speed
    # prefill rests on tens of first tokens (each one step): noisier than decode
    assert 1.2 <= f["prefill"] <= 4.0 and 2.4 <= s["prefill"] <= 8.0, speed
    assert s["prefill"] > f["prefill"], speed
    assert 1.4 <= s["decode"] / f["decode"] <= 2.6, speed
    assert f["prefill_tok_s"] > s["prefill_tok_s"] and f["itl_ms_at_slots"] < s["itl_ms_at_slots"]
    # the pool is planned with the replicas' harmonic mean (≈ 2.67), not the policy's 2
    assert float(speed["decode"]) > 2.2
    labels = {"pool": "chat", "phase": "decode"}
    assert reg.get_sample_value("tokenweir_pool_speed_factor", labels) == pytest.approx(
        speed["decode"], abs=1e-4
    )
    assert reg.get_sample_value("tokenweir_pool_speed_measured", {"pool": "chat"}) == 1.0
    rep = {"pool": "chat", "endpoint": eps[1], "phase": "decode"}
    value = reg.get_sample_value("tokenweir_replica_speed_factor", rep)
    assert value == pytest.approx(s["decode"], abs=1e-4)
    # the planner's figure follows: the same demand needs more replicas than the profile says
    plan = a.pools["chat"]
    demand = plan.window.demand()
    kw = {"ttft_s": 2.0, "tbt_s": 0.06, "headroom": plan.policy.headroom}
    rate = 40.0
    by_profile = replicas_for(demand, rate, profile_replica("seed-2k"), time_scale=2.0, **kw)
    d, p, _ = plan.speed
    by_measured = replicas_for(
        demand, rate, profile_replica("seed-2k"), time_scale=d, prefill_scale=p, **kw
    )
    assert by_measured.replicas > by_profile.replicas, (by_measured, by_profile)
    assert plan.last is not None and plan.last.need == replicas_for(
        demand, plan.forecast_rps, profile_replica("seed-2k"), time_scale=d, prefill_scale=p,
        **kw,
    )  # fmt: skip
