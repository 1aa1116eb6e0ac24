"""The batch runners' words read from a real Redis (poolstate/valley_reader.py): as the runner
writes them (``Records.publish_valley``), by the filter server's reader and by the control
plane's, whose online planner leaves the runners' lines out of a pool's demand."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from batch_service.records import Records
from controlplane.app import ControlPlane, ControlPlaneSettings
from policy import Address
from poolstate.valley import MAX_AGE_S, RunnerWord, valley_key
from poolstate.valley_reader import ValleyReader
from runtime.redis_connect import LazyRedis, connect_redis
from tests.controlplane.autoscale.test_controller import BATCH_POLICY
from tests.helpers import free_port

pytestmark = pytest.mark.timeout(60)


async def test_what_a_runner_writes_is_read_back_and_ages_out(redis_port: int) -> None:
    url = f"redis://127.0.0.1:{redis_port}/0"
    redis = await connect_redis(url, timeout=2.0)
    pool = f"p{time.monotonic_ns()}"
    clock = [0.0]
    errors: list[int] = []
    lazy = LazyRedis(url)
    reader = ValleyReader(lazy, clock=lambda: clock[0], wall=time.time,
                          on_error=lambda: errors.append(1))  # fmt: skip
    reader.configure((pool,))
    try:
        word = RunnerWord(12, round(time.time(), 3), 40, 4000, 400)
        await Records(redis).publish_valley(pool, "runner-0", word)
        await reader.read()
        assert reader.words(pool) == {"runner-0": word} and reader.lines(pool) == 12
        assert reader.words("other") == {}
        # Redis cannot be reached: the last read holds for MAX_AGE_S, then no runner counts
        lazy.use(f"redis://127.0.0.1:{free_port()}/0")
        await reader.read()
        assert errors and reader.lines(pool) == 12
        clock[0] += MAX_AGE_S + 0.1
        assert reader.words(pool) == {} and reader.lines(pool) == 0
        # no Redis at all: nothing is read, nothing counted
        lazy.use(None)
        await reader.read()
        assert reader.lines(pool) == 0
    finally:
        await redis.delete(valley_key(pool))
        await redis.aclose()
        await lazy.aclose()


async def test_the_control_planes_planner_reads_the_runners_words(
    tmp_path: Path, redis_port: int
) -> None:
    url = f"redis://127.0.0.1:{redis_port}/0"
    redis = await connect_redis(url, timeout=2.0)
    await redis.delete(valley_key("chat"))
    path = tmp_path / "mesh.yaml"
    path.write_text(BATCH_POLICY)
    settings = ControlPlaneSettings(
        path, Address("127.0.0.1", free_port()), Address("127.0.0.1", free_port()),
        redis_url=url,
    )  # fmt: skip
    plane = ControlPlane(settings)
    try:
        assert (await plane.start()).ok
        word = RunnerWord(30, round(time.time(), 3), 5, 500, 50)
        await Records(redis).publish_valley("chat", "runner-0", word)
        end = time.monotonic() + 10
        while plane.autoscaler.valley("chat") != {"runner-0": word}:
            assert time.monotonic() < end, "the planner never read the runner's word"
            await asyncio.sleep(0.05)
    finally:
        await plane.aclose()
        await redis.delete(valley_key("chat"))
        await redis.aclose()
