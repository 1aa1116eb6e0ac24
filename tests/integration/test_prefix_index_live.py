"""Real emulator processes publish KV events over ZMQ; the subscriber builds the prefix index.

Endpoints are ipc:// sockets in the test's folder (SGLang binds ipc endpoints; no port is
opened beyond the emulators' HTTP ports on 127.0.0.1). One replica restarts on the same
endpoints: the index forgets it, resyncs it from its replay socket and is right again.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from backends.emulator.tokenizer import encode
from prefixindex.index import PrefixIndex
from prefixindex.subscriber import KvEventSubscriber, ReplicaFeed
from tests.helpers import ChildProcess, free_port, wait_for_port

pytestmark = pytest.mark.integration

TEXTS = {
    "a": "shared system words then alpha one two three four",
    "b": "another document entirely beta five six seven",
}


def _start(tmp_path: Path, name: str, port: int) -> ChildProcess:
    kv = {
        "publisher": "zmq",
        "endpoint": f"ipc://{tmp_path}/{name}.pub",
        "replay_endpoint": f"ipc://{tmp_path}/{name}.replay",
    }
    argv = [sys.executable, "-m", "backends.emulator", "--port", str(port), "--profile"]
    argv += ["seed-2k", "--time-scale", "0.02", "--kv-events-config", json.dumps(kv)]
    child = ChildProcess(argv, log=tmp_path / f"{name}.log")
    wait_for_port(port, timeout=30)
    return child


async def _until(check: Callable[[], bool], what: Callable[[], str], timeout: float = 40.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"not reached in {timeout}s: {what()}")
        await asyncio.sleep(0.05)


async def test_subscriber_builds_the_index_and_survives_a_restart(tmp_path: Path) -> None:
    ports = {n: free_port() for n in TEXTS}
    children = {n: _start(tmp_path, n, p) for n, p in ports.items()}
    index = PrefixIndex(1, stale_after_s=10.0)
    feeds = [
        ReplicaFeed(n, f"ipc://{tmp_path}/{n}.pub", f"ipc://{tmp_path}/{n}.replay") for n in TEXTS
    ]
    sub = KvEventSubscriber(index, feeds, probe_interval_s=0.2)
    await sub.start()
    loop = asyncio.get_running_loop()

    def answers(name: str) -> dict[str, int | None]:
        return index.query(encode(TEXTS[name]), loop.time())

    def views() -> str:
        return "; ".join(str(index.view(n, loop.time())) for n in TEXTS)

    try:
        async with aiohttp.ClientSession() as http:

            async def generate(name: str) -> None:
                body = {"text": TEXTS[name], "sampling_params": {"max_new_tokens": 2}}
                async with http.post(f"http://127.0.0.1:{ports[name]}/generate", json=body) as r:
                    assert r.status == 200

            await _until(
                lambda: all(index.known(n, loop.time()) for n in TEXTS),
                lambda: "both known" + " " + views(),
            )
            for name in TEXTS:
                await generate(name)
            full = {n: len(encode(t)) for n, t in TEXTS.items()}
            await _until(
                lambda: answers("a") == {"a": full["a"], "b": 0},
                lambda: "a's prompt on a" + " " + views(),
            )
            await _until(
                lambda: answers("b") == {"a": 0, "b": full["b"]},
                lambda: "b's prompt on b" + " " + views(),
            )

            children["b"].close()
            await _until(
                lambda: answers("b")["b"] is None,
                lambda: "b unknown once it is gone" + " " + views(),
            )
            children["b"] = _start(tmp_path, "b", ports["b"])
            await _until(
                lambda: answers("b") == {"a": 0, "b": 0},
                lambda: "b known again, empty" + " " + views(),
            )
            await generate("b")
            await _until(
                lambda: answers("b") == {"a": 0, "b": full["b"]},
                lambda: "b's prompt again" + " " + views(),
            )

            async with http.post(f"http://127.0.0.1:{ports['a']}/flush_cache") as r:
                assert r.status == 200
            await _until(
                lambda: answers("a") == {"a": 0, "b": 0}, lambda: "a flushed" + " " + views()
            )
        assert sub.decode_errors == 0
        assert index.view("b", loop.time()).known
    finally:
        await sub.aclose()
        for child in children.values():
            child.close()
