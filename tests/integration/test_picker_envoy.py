"""The endpoint picker through real Envoy: three emulators publishing KV events, the filter
server's picker naming a replica, the pool cluster's override-host load balancer obeying it.

- a prompt sharing a long prefix with an earlier one goes to the replica that cached it (the
  emulator reports the cached tokens in its usage answer), with the index alone (no pending
  picks: ``pending_ttl: 0s``);
- prompts with nothing cached spread by load;
- a killed replica is not picked: the index forgets it on disconnect, and its requests are
  served by a live replica (200, never an error).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from filters.app import FilterApp, Settings
from tests.helpers import ChildProcess, free_port, wait_for_port
from tests.integration.mesh_harness import mesh

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

OFFSET = 1000


def policy_text(
    gw: int,
    fp: int,
    replicas: list[int],
    *,
    message_timeout: str = "2s",
    routing: tuple[str, ...] = ("pending_ttl: 0s",),
    match: str = "{path: /generate}",
) -> str:
    """The mesh of these tests; ``routing``: lines added to the pool's routing settings;
    ``match``: the one route's match."""
    more = "".join(f"\n      {line}" for line in routing)
    eps = ", ".join(f"127.0.0.1:{p}" for p in replicas)
    return f"""
version: 1
control_plane: {{xds: 127.0.0.1:1, metrics: 127.0.0.1:2}}
filters: {{address: 127.0.0.1:{fp}, message_timeout: {message_timeout}}}
pools:
  chat:
    models: [m1]
    endpoints: [{eps}]
    health_check: {{interval: 200ms, timeout: 200ms, unhealthy_threshold: 1}}
    routing:
      mode: prefix_index
      min_prefix_tokens: 64
      checkpoint_bytes: 256
      index_ttl: 5s
      kv_events_port_offset: {OFFSET}{more}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes:
      - name: native
        match: {match}
        pool: chat
        filters: {{plugins: [{{name: identity, settings: {{require: false}}}}, tokens, picker, usage]}}
"""


def _emulator(
    tmp_path: Path, i: int, port: int, time_scale: float = 0.01, extra: tuple[str, ...] = ()
) -> ChildProcess:
    kv = {
        "publisher": "zmq",
        "endpoint": f"tcp://*:{port + OFFSET}",
        "replay_endpoint": f"tcp://127.0.0.1:{port + OFFSET + 1}",
    }
    argv = [sys.executable, "-m", "backends.emulator", "--port", str(port), "--model", "m1"]
    argv += ["--time-scale", str(time_scale), "--seed", str(i), "--log-level", "WARNING"]
    argv += ["--kv-events-config", json.dumps(kv), *extra]
    return ChildProcess(argv, log=tmp_path / f"emulator{i}.log")


def _doc(tag: str, words: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(words))


async def _until(check: Callable[[], bool], what: Callable[[], str], timeout: float = 40) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout}s: {what()}")
        await asyncio.sleep(0.05)


async def _free_port_block() -> list[int]:
    """Three HTTP ports whose +OFFSET and +OFFSET+1 neighbours are free too."""
    out: list[int] = []
    while len(out) < 3:
        p = free_port()
        if _bindable(p + OFFSET, "") and _bindable(p + OFFSET + 1, "127.0.0.1"):
            out.append(p)
    return out


def _bindable(port: int, host: str) -> bool:
    if port >= 65536:
        return False
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


async def test_picker_sends_a_shared_prefix_to_its_replica_and_skips_a_dead_one(
    tmp_path: Path,
) -> None:
    gw, fp = free_port(), free_port()
    replicas = await _free_port_block()
    children = {p: _emulator(tmp_path, i, p) for i, p in enumerate(replicas)}
    app: FilterApp | None = None
    try:
        for p in replicas:
            await asyncio.to_thread(wait_for_port, p, 30.0)
        async with mesh(tmp_path, policy_text(gw, fp, replicas), {"edge": gw}) as m:
            app = FilterApp(Settings(policy_path=m.policy_path), clock=time.monotonic)
            await app.start()
            picker = app.pickers.get("chat")
            assert picker is not None
            names = [f"127.0.0.1:{p}" for p in replicas]
            now = time.monotonic
            await _until(
                lambda: all(picker.index.known(n, now()) for n in names),
                lambda: str([picker.index.view(n, now()) for n in names]),
            )
            url = f"http://127.0.0.1:{gw}/generate"
            async with aiohttp.ClientSession() as http:

                async def generate(text: str) -> tuple[int, dict[str, object]]:
                    body = {"text": text, "sampling_params": {"max_new_tokens": 2}}
                    async with http.post(url, json=body) as r:
                        data = await r.json() if r.status == 200 else {}
                        return r.status, data.get("meta_info", {})

                doc = _doc("alpha", 600)
                status, meta = await generate(doc + " first question")
                assert status == 200, status
                # the stream's end (a moment after the answer) counts it out of its replica
                await _until(
                    lambda: all(picker.inflight.get(n) == 0 for n in names),
                    lambda: str(picker.inflight),
                )
                # the picker maps the prompt off the request path, the replica publishes it
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
                assert len(owner) == 1
                # the same long prefix, a new question: it goes where the prefix is cached
                for q in ("second question", "third question"):
                    status, meta = await generate(doc + " " + q)
                    assert status == 200
                    assert int(meta["cached_tokens"]) >= 550, meta  # type: ignore[call-overload]
                reg = app.metrics.registry
                cache_picks = reg.get_sample_value(
                    "tokenweir_picker_picks_total", {"pool": "chat", "reason": "cache"}
                )
                assert cache_picks is not None and cache_picks >= 2
                # routing regret, from Envoy's access log (this route is metered in Envoy): the
                # three requests on the owner, each cached share predicted within a quarter
                # of the prompt
                labels = {"pool": "chat", "replica": owner[0]}
                err = "tokenweir_picker_cached_prediction_error"

                def regret(suffix: str, **more: str) -> float:
                    got = reg.get_sample_value(err + suffix, {**labels, **more})
                    return got or 0.0

                await _until(lambda: regret("_count") >= 3, lambda: f"{regret('_count')} seen")
                near = regret("_bucket", le="0.25") - regret("_bucket", le="-0.25")
                assert near == regret("_count"), [
                    regret("_bucket", le=b) for b in ("-0.25", "0.25")
                ]
                # kill the owner: the index forgets it, the next request goes to a live replica
                dead = owner[0]
                children[int(dead.rsplit(":", 1)[1])].close()
                await _until(
                    lambda: not picker.index.known(dead, now()),
                    lambda: str(picker.index.view(dead, now())),
                )
                for q in ("fourth question", "fifth question"):
                    status, meta = await generate(doc + " " + q)
                    assert status == 200
                    pick = picker.pick(picker.prompt((doc + " " + q).encode()))
                    assert pick.replica not in (None, dead)
    finally:
        if app is not None:
            await app.aclose()
        for c in children.values():
            c.close()


def _children_of(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


async def test_filter_server_with_a_busy_picker_exits_on_sigterm(tmp_path: Path) -> None:
    """Traffic through the picker (its worker process spawned, prompts mapped, the KV-event
    subscriber connected), then SIGTERM to the filter server's process group (the worker's too): it drains and exits within
    seconds and leaves no worker process behind."""
    gw, fp = free_port(), free_port()
    replicas = await _free_port_block()
    children = {p: _emulator(tmp_path, i, p) for i, p in enumerate(replicas)}
    server: ChildProcess | None = None
    try:
        for p in replicas:
            await asyncio.to_thread(wait_for_port, p, 30.0)
        async with mesh(tmp_path, policy_text(gw, fp, replicas), {"edge": gw}) as m:
            argv = [sys.executable, "-m", "filters", "--policy", str(m.policy_path)]
            argv += ["--drain-timeout", "2", "--metrics-port", str(free_port())]
            server = ChildProcess(argv, log=tmp_path / "filters.log")
            await asyncio.to_thread(wait_for_port, fp, 30.0)
            url = f"http://127.0.0.1:{gw}/generate"
            async with aiohttp.ClientSession() as http:
                for i in range(4):
                    body = {
                        "text": _doc(f"t{i}x", 400) + " question",
                        "sampling_params": {"max_new_tokens": 2},
                    }
                    async with http.post(url, json=body) as r:
                        assert r.status == 200, (r.status, await r.text(), server.output())
            pid = server.proc.pid
            await _until(lambda: bool(_children_of(pid)), lambda: "no worker process spawned")
            await asyncio.sleep(0.5)  # the worker maps the prompts
            workers = _children_of(pid)
            os.killpg(pid, signal.SIGTERM)  # its process group, as `tokenweir up` stops it
            try:
                code = await asyncio.to_thread(server.proc.wait, 8.0)
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"still running 8s after SIGTERM:\n{server.output()}"
                ) from None
            assert code == 0, server.output()
            await _until(
                lambda: not any(Path(f"/proc/{w}").exists() for w in workers),
                lambda: f"worker processes left: {workers}",
                timeout=5,
            )
    finally:
        if server is not None:
            server.close()
        for c in children.values():
            c.close()
