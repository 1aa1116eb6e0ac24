"""A vLLM-flavoured emulator process and the subscriber: the index follows a vLLM replica.

vLLM announces no empty cache at start: the replica is known as soon as its replay socket says it
has published nothing (before any request), its stored blocks land under the hashes the picker
computes for the prompt (recomputed from the events' token ids: vLLM's own are seeded per
process), and a restarted replica (a new seed) is followed again.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from backends.emulator.tokenizer import encode
from prefixindex.index import PrefixIndex
from prefixindex.subscriber import KvEventSubscriber, ReplicaFeed
from tests.helpers import ChildProcess, free_port, wait_for_port
from tests.integration.test_prefix_index_live import _until

pytestmark = pytest.mark.integration

TEXT = " ".join(f"word{i}" for i in range(200))


def _start(tmp_path: Path, port: int) -> ChildProcess:
    kv = {
        "publisher": "zmq",
        "endpoint": f"ipc://{tmp_path}/v.pub",
        "replay_endpoint": f"ipc://{tmp_path}/v.replay",
    }
    argv = [sys.executable, "-m", "backends.emulator", "--flavor", "vllm", "--port", str(port)]
    argv += ["--block-size", "16", "--time-scale", "0.02", "--kv-events-config", json.dumps(kv)]
    child = ChildProcess(argv, log=tmp_path / "v.log")
    wait_for_port(port, timeout=30)
    return child


async def test_a_vllm_replica_is_known_from_its_empty_replay_and_followed_across_restarts(
    tmp_path: Path,
) -> None:
    port = free_port()
    child = _start(tmp_path, port)
    index = PrefixIndex(16, stale_after_s=10.0)
    feed = ReplicaFeed("v", f"ipc://{tmp_path}/v.pub", f"ipc://{tmp_path}/v.replay", backend="vllm")
    sub = KvEventSubscriber(index, [feed], probe_interval_s=0.2)
    await sub.start()
    tokens = encode(TEXT)
    whole = len(tokens) - len(tokens) % 16
    try:
        # known before any request: nothing published yet means an empty cache
        await _until(lambda: index.known("v", time.monotonic()), lambda: str(index.view("v", 0)))
        assert index.query(tokens, time.monotonic()) == {"v": 0}
        async with aiohttp.ClientSession() as http:
            for attempt in range(2):
                body = {"model": "emulated-model", "prompt": TEXT, "max_tokens": 1}
                async with http.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as r:
                    assert r.status == 200
                await _until(
                    lambda: index.query(tokens, time.monotonic()) == {"v": whole},
                    lambda: f"{index.query(tokens, time.monotonic())}, {index.view('v', 0)}",
                )
                assert sub.decode_errors == 0
                if attempt == 0:  # a new process, a new seed: forgotten, then followed again
                    child.close()
                    child = _start(tmp_path, port)
                    await _until(
                        lambda: index.query(tokens, time.monotonic()) == {"v": 0},
                        lambda: str(index.view("v", time.monotonic())),
                    )
    finally:
        await sub.aclose()
        child.close()
