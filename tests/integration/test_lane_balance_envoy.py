"""A ranked pool balanced by lane, on real Envoy and two real emulators.

Two batch streams, then two interactive streams, fill a pool of two replicas with two slots
each. The filter server names every request's replica (``x-tokenweir-endpoint``, honoured by
Envoy's override-host load balancer): batch spreads by load, interactive by the interactive
load it cannot preempt, so each replica runs one of each and none queues (the emulators' own
``/get_load`` says so). A third interactive request then preempts the batch stream of the
replica it is sent to and streams to its end while all four long streams are unfinished."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from filters.app import FilterApp, Settings
from tests.helpers import ChildProcess, free_port, wait_for_port
from tests.integration.mesh_harness import mesh
from tests.integration.test_admission_priority_envoy import Stream, policy, stream

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

LONG = 300


@pytest.fixture
async def emulators(tmp_path: Path) -> AsyncIterator[list[int]]:
    ports = [free_port(), free_port()]
    children = []
    try:
        for i, port in enumerate(ports):
            argv = [sys.executable, "-m", "backends.emulator", "--port", str(port)]
            argv += ["--model", "m", "--profile", "seed-2k", "--time-scale", "0.2"]
            argv += ["--max-running-requests", "2", "--enable-priority-scheduling"]
            children.append(ChildProcess(argv, log=tmp_path / f"emulator-{i}.log"))
        for port in ports:
            wait_for_port(port, timeout=30)
        yield ports
    finally:
        for child in children:
            child.close()


async def _started(streams: list[Stream], tasks: list[asyncio.Task[None]]) -> None:
    end = time.monotonic() + 60
    while not all(s.tokens >= 3 for s in streams):
        assert time.monotonic() < end and not any(t.done() for t in tasks)
        await asyncio.sleep(0.01)


async def test_each_replica_runs_one_of_each_lane_and_the_next_interactive_preempts(
    tmp_path: Path, emulators: list[int]
) -> None:
    gw, fp = free_port(), free_port()
    async with mesh(tmp_path, policy(gw, fp, emulators, ranked=True), {"edge": gw}) as m:
        app = FilterApp(Settings(policy_path=m.policy_path), clock=time.monotonic)
        await app.start()
        try:
            url = f"http://127.0.0.1:{gw}"
            async with aiohttp.ClientSession() as http:
                long = [Stream() for _ in range(4)]
                tasks = []
                for tier, group in (("free", long[:2]), ("pro", long[2:])):
                    tasks += [asyncio.create_task(stream(http, url, tier, LONG, s)) for s in group]
                    await _started(group, tasks)
                loads, states = [], []
                for port in emulators:
                    async with http.get(f"http://127.0.0.1:{port}/get_load") as r:
                        loads.append((await r.json())[0])
                    async with http.get(f"http://127.0.0.1:{port}/_emulator/state") as r:
                        states.append(await r.json())
                placed = {name: dict(c) for name, c in app.balance.pools["chat"].inflight.items()}
                urgent = Stream()
                await stream(http, url, "pro", 5, urgent)
                await asyncio.wait_for(asyncio.gather(*tasks), 120)
        finally:
            await app.aclose()
    assert [(x["num_running_reqs"], x["num_waiting_reqs"]) for x in loads] == [(2, 0), (2, 0)]
    # the emulators' own view (priorities as the tokens plugin wrote them): one of each
    assert [(x["running"], x["waiting"]) for x in states] == [({"0": 1, "100": 1}, {})] * 2
    assert sorted(placed) == sorted(f"127.0.0.1:{p}" for p in emulators)
    assert all(c == {0: 1, 100: 1} for c in placed.values()), placed
    assert urgent.tokens == 5 and urgent.done_at is not None
    assert urgent.done_at < min(s.done_at for s in long if s.done_at is not None)
    for s in long:  # the preempted batch stream resumed: nothing lost, nothing repeated
        assert s.tokens == LONG and s.completion_tokens == LONG
    assert sum(x["preempted_total"] for x in states) == 0  # the urgent one came after
