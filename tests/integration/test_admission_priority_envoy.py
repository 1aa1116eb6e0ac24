"""Admission in front of a pool that ranks by priority, on real Envoy and a real emulator.

Two batch streams fill the pool's two slots. With ``priority_scheduling`` on (the emulator runs
with ``--enable-priority-scheduling``), the gateway writes each lane's priority into the body
and lets an interactive request past the batch slots: the backend preempts a batch stream, the
interactive answer streams while both batch streams are unfinished, and both still end with
every token. With it off, the same interactive request waits at the gateway for a batch
stream to end (the order of events decides, not a time threshold). With it declared but the
emulator started without the flag, the control plane's pool state shows the replica does not
rank and the gateway admits as for the pool that is off."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from filters.app import FilterApp, Settings
from tests.helpers import ChildProcess, free_port, sse_events, wait_for_port
from tests.integration.mesh_harness import mesh

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

BATCH_TOKENS = 400
KEYS = {"pro": "pro-key-12345", "free": "free-key-12345"}


def policy(gw: int, fp: int, backend: int | list[int], ranked: bool, cp: int = 2) -> str:
    """The pool's endpoints: ``backend`` (one port or several), 2 slots each."""
    scheduling = "{enabled: true}" if ranked else "{enabled: false}"
    ports = backend if isinstance(backend, list) else [backend]
    endpoints = ", ".join(f"127.0.0.1:{p}" for p in ports)
    return f"""
version: 1
control_plane: {{xds: 127.0.0.1:1, metrics: 127.0.0.1:{cp}}}
filters: {{address: 127.0.0.1:{fp}, message_timeout: 2s}}
admission:
  interactive: {{ttft_budget: 60s, max_wait: 30s, max_queue: 4}}
  batch: {{ttft_budget: 60s, max_wait: 30s, max_queue: 4, leave_for_higher: null}}
pools:
  chat:
    models: [m]
    endpoints: [{endpoints}]
    capacity: {{max_running_requests: 2}}
    priority_scheduling: {scheduling}
    health_check: {{enabled: false}}
    retries: {{enabled: false}}
    outlier_detection: {{enabled: false}}
    timeouts: {{request: 0s, stream_idle: 60s}}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes:
      - name: llm
        match: {{prefix: /v1/}}
        pool: chat
        filters: {{plugins: [identity, lane, admission, tokens]}}
tiers:
  free: {{lane: batch, allowed_lanes: [batch], max_tokens: 4096}}
  pro: {{lane: interactive, max_tokens: 4096}}
tenants:
  alice: {{tier: pro, api_keys: [{KEYS["pro"]}]}}
  bob: {{tier: free, api_keys: [{KEYS["free"]}]}}
"""


@dataclass
class Stream:
    tokens: int = 0
    completion_tokens: int | None = None
    done_at: float | None = None
    first_at: float | None = None


async def stream(http: aiohttp.ClientSession, url: str, tier: str, n: int, out: Stream) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": f"write {n} words about rivers"}],
        "max_tokens": n,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"authorization": f"Bearer {KEYS[tier]}"}
    async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
        async for event in sse_events(r.content):
            if event.get("usage"):
                out.completion_tokens = event["usage"]["completion_tokens"]
            for choice in event["choices"]:
                if choice["delta"].get("content"):
                    out.tokens += 1
                    out.first_at = out.first_at or time.monotonic()
    out.done_at = time.monotonic()


@pytest.fixture
async def emulator(
    tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[int, bool]]:
    """(port, ranked): an emulator with or without ``--enable-priority-scheduling``."""
    port = free_port()
    argv = [sys.executable, "-m", "backends.emulator", "--port", str(port), "--model", "m"]
    argv += ["--profile", "seed-2k", "--time-scale", "0.2", "--max-running-requests", "2"]
    if request.param:
        argv.append("--enable-priority-scheduling")
    child = ChildProcess(argv, log=tmp_path / "emulator.log")
    try:
        wait_for_port(port, timeout=30)
        yield port, bool(request.param)
    finally:
        child.close()


async def batch_then_urgent(app: FilterApp, url: str) -> tuple[list[Stream], Stream]:
    """Two batch streams fill the pool, then one interactive request; all run to their end."""
    async with aiohttp.ClientSession() as http:
        batch = [Stream(), Stream()]
        tasks = [asyncio.create_task(stream(http, url, "free", BATCH_TOKENS, s)) for s in batch]
        end = time.monotonic() + 60
        while not all(s.tokens >= 3 for s in batch):  # both run: the pool is full
            assert time.monotonic() < end and not any(t.done() for t in tasks)
            await asyncio.sleep(0.01)
        gate = app.gates.gate("chat")
        assert gate is not None and gate.core.in_flight == 2
        urgent = Stream()
        await stream(http, url, "pro", 5, urgent)
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
    assert urgent.tokens == 5 and urgent.first_at is not None
    for s in batch:  # a preempted stream resumed: nothing lost, nothing repeated
        assert s.tokens == BATCH_TOKENS and s.completion_tokens == BATCH_TOKENS
    return batch, urgent


def first_done(batch: list[Stream]) -> float:
    return min(s.done_at for s in batch if s.done_at is not None)


@pytest.mark.parametrize("emulator", [True, False], ids=["ranked", "unranked"], indirect=True)
async def test_interactive_preempts_batch_only_where_the_pool_ranks(
    tmp_path: Path, emulator: tuple[int, bool]
) -> None:
    port, ranked = emulator
    gw, fp = free_port(), free_port()
    async with mesh(tmp_path, policy(gw, fp, port, ranked), {"edge": gw}) as m:
        app = FilterApp(Settings(policy_path=m.policy_path), clock=time.monotonic)
        await app.start()
        try:
            batch, urgent = await batch_then_urgent(app, f"http://127.0.0.1:{gw}")
        finally:
            await app.aclose()
    if ranked:  # it streamed while both batch streams were still unfinished
        assert urgent.done_at is not None and urgent.done_at < first_done(batch)
    else:  # it waited at the gateway for a batch slot to free
        assert urgent.first_at is not None and urgent.first_at > first_done(batch)


@pytest.mark.parametrize("emulator", [False], ids=["started-without-the-flag"], indirect=True)
async def test_a_pool_declared_ranked_whose_replica_does_not_rank_is_admitted_as_unranked(
    tmp_path: Path, emulator: tuple[int, bool]
) -> None:
    port, _ = emulator
    gw, fp, cp = free_port(), free_port(), free_port()
    text = policy(gw, fp, port, ranked=True, cp=cp)
    async with mesh(tmp_path, text, {"edge": gw}, metrics_port=cp) as m:
        replica = f"127.0.0.1:{port}"

        async def rank() -> object:
            _, _, body = await m.get(cp, "/api/v1/pools")  # the published pool state
            return json.loads(body)["pools"].get("chat", {}).get("endpoints", {}).get(replica)

        end, got = time.monotonic() + 20, await rank()
        while not (isinstance(got, dict) and "rank" in got) and time.monotonic() < end:
            await asyncio.sleep(0.1)  # the first scrape rounds may still be due
            got = await rank()
        assert isinstance(got, dict) and got["rank"] == {"on": False, "thr": 10, "low": False}
        _, _, metrics = await m.get(cp, "/metrics")
        assert f'tokenweir_replica_ranked{{endpoint="{replica}",pool="chat"}} 0.0' in metrics
        app = FilterApp(Settings(policy_path=m.policy_path), clock=time.monotonic)
        await app.start()  # it reads the pool state before it serves
        try:
            gate = app.gates.gate("chat")
            assert gate is not None and not gate.core.preemptive and gate.unranked is not None
            ranked = app.metrics.registry.get_sample_value(
                "tokenweir_admission_ranked", {"pool": "chat"}
            )
            assert ranked == 0
            batch, urgent = await batch_then_urgent(app, f"http://127.0.0.1:{gw}")
            admitted = {
                how: app.metrics.registry.get_sample_value(
                    "tokenweir_admission_admitted_total",
                    {"pool": "chat", "lane": "interactive", "how": how},
                )
                for how in ("at_once", "queued")
            }
        finally:
            await app.aclose()
    # admitted at once, it would have waited behind batch in the replica's queue (the client
    # sees the same order): it waited at the gateway for a batch slot instead
    assert admitted == {"at_once": None, "queued": 1.0}
    assert urgent.first_at is not None and urgent.first_at > first_done(batch)
