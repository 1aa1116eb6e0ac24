"""`tokenweir up --replicas filters=2` with admission: the two filter servers behind the same
Envoy share the pool's capacity (each admits half), so the pool never runs more than its
declared capacity, however Envoy spreads the requests over them."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from tests.helpers import free_port
from tests.integration.up_process import start_up, stop_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CAPACITY = 4


def _policy(gw: int, base: int, fp: int, mp: int) -> str:
    xds, metrics = free_port(), free_port()
    return f"""
version: 1
control_plane: {{xds: 127.0.0.1:{xds}, metrics: 127.0.0.1:{metrics}}}
filters: {{address: 127.0.0.1:{fp}, metrics_port: {mp}, message_timeout: 5s}}
pools:
  chat:  # one replica, slow enough that a burst overlaps; the capacity admission splits
    models: [llama-3.1-8b]
    emulated: {{replicas: 1, profile: llama-3.1-8b-h100, base_port: {base}, time_scale: 2.0}}
    capacity: {{max_running_requests: {CAPACITY}}}
    retries: {{enabled: false}}
gateways:
  edge: {{listen: 127.0.0.1:{gw}, routes: [{{name: chat, pool: chat, match: {{prefix: /v1/}},
         filters: {{plugins: [admission]}}}}]}}
admission:
  interactive: {{ttft_budget: 30s, max_wait: 15s, max_queue: 64}}
"""


def _metric(port: int, name: str, labels: str = "") -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    pattern = "^" + re.escape(name) + r"(\{[^}]*\})?\s+(\S+)$"
    values = [
        float(m.group(2))
        for m in re.finditer(pattern, text, re.MULTILINE)
        if labels in (m.group(1) or "")
    ]
    return sum(values)


async def _burst(url: str, n: int) -> list[int]:
    body = {
        "model": "llama-3.1-8b",
        "messages": [{"role": "user", "content": "tell me a long story"}],
        "max_tokens": 48,
        "stream": True,
    }
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as http:

        async def one() -> int:
            async with http.post(url, data=json.dumps(body)) as r:
                await r.read()
                return r.status

        return list(await asyncio.gather(*(one() for _ in range(n))))


async def test_two_filter_servers_never_admit_more_than_the_pool(tmp_path: Path) -> None:
    gw, base, fp, mp = free_port(), free_port(), free_port(), free_port()
    while mp + 1 in (gw, base, fp):  # the second filter server's metrics port is mp + 1
        mp = free_port()
    policy = tmp_path / "mesh.yaml"
    policy.write_text(_policy(gw, base, fp, mp))
    proc, banner = start_up(policy, tmp_path / "run", extra_args=("--replicas", "filters=2"))
    try:
        assert "tokenweir up: ready" in banner, banner
        assert "filters#1" in banner, banner
        # each filter server admits its half of the pool (the split rule counts them)
        assert [_metric(p, "tokenweir_admission_limit", 'pool="chat"') for p in (mp, mp + 1)] == [
            CAPACITY / 2,
            CAPACITY / 2,
        ]
        running: list[float] = []
        burst = asyncio.create_task(_burst(f"http://127.0.0.1:{gw}/v1/chat/completions", 12))
        while not burst.done():
            running.append(_metric(base, "sglang:num_running_reqs"))
            await asyncio.sleep(0.05)
        statuses = burst.result()
        assert statuses == [200] * 12
        # the pool ran at its capacity and never past it (without the split: up to 2x)
        assert max(running) == CAPACITY, running
        admitted = [_metric(p, "tokenweir_admission_admitted_total") for p in (mp, mp + 1)]
        assert all(a > 0 for a in admitted) and sum(admitted) == 12  # both took requests
    finally:
        stop_up(proc)
