"""A ``backend: vllm`` pool end to end: real Envoy, the control plane, a filter server with the
picker and admission, three emulators in vLLM flavour (vLLM's metric names, no SGLang endpoint,
vLLM's KV-event fields with block hashes seeded per process).

- cache-aware routing from vLLM's events: a prompt sharing a long prefix with an earlier one
  goes to the replica that cached it (its usage reports the cached tokens), which the picker can
  only know by recomputing each stored block's hash from the event's token ids;
- saturation from vLLM's metrics: the control plane's pool state shows each replica's
  ``vllm:num_requests_running`` / ``vllm:num_requests_waiting``; admission lets the whole
  capacity in while they idle, and lowers its limit to one request while their queues fill.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from filters.app import FilterApp, Settings
from tests.helpers import ChildProcess, free_port, wait_for_port
from tests.integration.mesh_harness import mesh
from tests.integration.test_picker_envoy import OFFSET, _doc, _free_port_block, _until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SEQS = 2  # each emulator's --max-num-seqs, the pool's capacity.max_running_requests


def policy_text(gw: int, fp: int, cp: int, replicas: list[int]) -> str:
    eps = ", ".join(f"127.0.0.1:{p}" for p in replicas)
    plugins = (
        "[{name: identity, settings: {require: false}}, lane, admission, tokens, picker, usage]"
    )
    return f"""
version: 1
control_plane: {{xds: 127.0.0.1:1, metrics: 127.0.0.1:{cp},
                pool_state: {{interval: 100ms, stale_after: 2s}}}}
filters: {{address: 127.0.0.1:{fp}, message_timeout: 5s}}
admission:
  interactive: {{ttft_budget: 30s, max_wait: 20s, max_queue: 16}}
  batch: {{ttft_budget: 60s, max_wait: 20s, max_queue: 16}}
pools:
  chat:
    backend: vllm
    models: [m1]
    endpoints: [{eps}]
    capacity: {{max_running_requests: {SEQS}}}
    health_check: {{interval: 200ms, timeout: 200ms, unhealthy_threshold: 1}}
    routing:
      mode: prefix_index
      page_size: 16
      min_prefix_tokens: 64
      checkpoint_bytes: 256
      index_ttl: 5s
      pending_ttl: 0s
      kv_events_port_offset: {OFFSET}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes:
      - name: completions
        match: {{path: /v1/completions}}
        pool: chat
        filters: {{plugins: {plugins}}}
"""


def _vllm_emulator(tmp_path: Path, i: int, port: int) -> ChildProcess:
    kv = {
        "publisher": "zmq",
        "endpoint": f"tcp://*:{port + OFFSET}",
        "replay_endpoint": f"tcp://127.0.0.1:{port + OFFSET + 1}",
    }
    argv = [sys.executable, "-m", "backends.emulator", "--flavor", "vllm", "--port", str(port)]
    argv += ["--model", "m1", "--time-scale", "0.2", "--seed", str(i), "--log-level", "WARNING"]
    argv += ["--max-num-seqs", str(SEQS), "--block-size", "16"]
    argv += ["--kv-events-config", json.dumps(kv)]
    return ChildProcess(argv, log=tmp_path / f"emulator{i}.log")


async def test_a_vllm_pool_routes_by_its_kv_events_and_admits_by_its_metrics(
    tmp_path: Path,
) -> None:
    gw, fp, cp = free_port(), free_port(), free_port()
    replicas = await _free_port_block()
    children = {p: _vllm_emulator(tmp_path, i, p) for i, p in enumerate(replicas)}
    names = [f"127.0.0.1:{p}" for p in replicas]
    app: FilterApp | None = None
    try:
        for p in replicas:
            await asyncio.to_thread(wait_for_port, p, 30.0)
        text = policy_text(gw, fp, cp, replicas)
        async with (
            mesh(tmp_path, text, {"edge": gw}, metrics_port=cp) as m,
            aiohttp.ClientSession() as http,
        ):
            # a vLLM server has no SGLang endpoint: the emulator answers as one would
            async with http.get(f"http://{names[0]}/get_server_info") as r:
                assert r.status == 404
            async with http.get(f"http://{names[0]}/metrics") as r:
                assert "vllm:num_requests_waiting" in await r.text()

            app = FilterApp(Settings(policy_path=m.policy_path), clock=time.monotonic)
            await app.start()
            picker = app.pickers.get("chat")
            assert picker is not None
            scraper = m.plane.scraper

            def limit() -> int | None:
                """Admission's limit for the pool now (a look at the gate reads the pool state)."""
                g = app.gates.gate("chat") if app is not None else None
                return g.core.max_requests if g is not None else None

            def fresh() -> bool:
                s = scraper.state.pools.get("chat")
                return s is not None and all(not s.endpoints[n].stale for n in names)

            # vLLM's metrics are read: every replica fresh and idle, the whole capacity admitted
            await _until(fresh, lambda: str(scraper.state.pools.get("chat")))
            await _until(
                lambda: limit() == SEQS * len(names),
                lambda: f"admission limit {limit()}",
            )
            # the first batch of a vLLM publisher is a baseline: each becomes known after a
            # request of its own (vLLM announces no empty cache at start)
            url = f"http://127.0.0.1:{gw}/v1/completions"

            async def complete(prompt: str, max_tokens: int = 2) -> tuple[int, int]:
                body = {"model": "m1", "prompt": prompt, "max_tokens": max_tokens}
                async with http.post(url, json=body) as r:
                    data = await r.json() if r.status == 200 else {}
                usage = data.get("usage") or {}
                details = usage.get("prompt_tokens_details") or {}
                return r.status, int(details.get("cached_tokens") or 0)

            for i in range(6):
                status, _ = await complete(_doc(f"warm{i}x", 80))
                assert status == 200
            now = time.monotonic
            await _until(
                lambda: all(picker.index.known(n, now()) for n in names),
                lambda: str([picker.index.view(n, now()) for n in names]),
            )
            doc = _doc("alpha", 600)
            status, _ = await complete(doc + " first question")
            assert status == 200
            await _until(
                lambda: len(picker.map.lookup(picker.prompt(doc.encode()).marks)) >= 10,
                lambda: f"checkpoints mapped: {len(picker.map)}",
            )
            owner: list[str] = []

            def held() -> bool:
                counts = picker._held(picker.prompt(doc.encode()).points, now())
                owner[:] = [n for n, c in counts.items() if c and c >= 10]
                return bool(owner)

            await _until(held, lambda: "no replica holds the document yet")
            assert len(owner) == 1, owner
            for q in ("second question", "third question"):
                status, cached = await complete(doc + " " + q)
                assert status == 200
                assert cached >= 550, cached
            picks = app.metrics.registry.get_sample_value(
                "tokenweir_picker_picks_total", {"pool": "chat", "reason": "cache"}
            )
            assert picks is not None and picks >= 2

            # fill every replica past its --max-num-seqs, straight to the servers: their
            # vllm:num_requests_waiting rises, the pool state shows it, admission admits one
            async def direct(port: int) -> None:
                body = {"model": "m1", "prompt": "busy", "max_tokens": 400}
                async with http.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as r:
                    await r.read()

            load = [asyncio.create_task(direct(p)) for p in replicas for _ in range(SEQS + 3)]

            def queued() -> bool:
                s = scraper.state.pools.get("chat")
                return s is not None and all(
                    s.endpoints[n].running == SEQS and s.endpoints[n].queued >= 2 for n in names
                )

            await _until(queued, lambda: str(scraper.state.pools.get("chat")), timeout=20)
            await _until(
                lambda: limit() == 1,
                lambda: f"admission limit {limit()}",
                timeout=10,
            )
            await asyncio.gather(*load)
            await _until(
                lambda: limit() == SEQS * len(names),
                lambda: f"admission limit {limit()}",
            )
    finally:
        if app is not None:
            await app.aclose()
        for c in children.values():
            c.close()
