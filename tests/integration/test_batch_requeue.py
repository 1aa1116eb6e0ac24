"""A job created but never queued (its API server died between the two Redis calls) is queued
by a runner's sweep once its intent is older than ``runner.claim_idle``, exactly once; a real
Redis, and a runner that then runs the job against a real (emulated) replica (issue 41)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from batch_service.files import DirectoryStore
from batch_service.records import INTENTS, ORPHAN_FACTOR, QUEUE, Records
from batch_service.runner import BatchRunner, RunnerSettings
from policy.batch import BatchPolicy
from policy.batch import BatchRunner as RunnerPolicy
from runtime.redis_connect import connect_redis
from runtime.tasks import stop_task
from tests.helpers import ChildProcess, free_port, wait_for_port
from tests.integration.test_batch_runner import IdlePool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

EP = "/v1/chat/completions"


class DiesBeforeQueueing(Records):
    """An API server killed right after it created the job, before it queued it."""

    async def enqueue(self, tenant: str, job_id: str) -> bool:
        raise ConnectionError("the API server died here")


def _job(jid: str, created: float, n: int) -> dict[str, object]:
    return {
        "id": jid, "endpoint": EP, "input_file_id": "file-in", "completion_window": "24h",
        "created_at": int(created), "status": "validating", "total": n, "completed": 0,
        "failed": 0, "expires_at": int(created) + 3600, "model": "m", "key": "", "metadata": "",
    }  # fmt: skip


@pytest.fixture
async def redis(redis_port: int) -> AsyncIterator[object]:
    client = await connect_redis(f"redis://127.0.0.1:{redis_port}/6", timeout=2.0)
    await client.flushdb()
    try:
        yield client
    finally:
        await client.flushdb()
        await client.aclose()


async def test_a_job_left_unqueued_is_queued_once_by_the_sweep(redis: object) -> None:
    records, dying = Records(redis), DiesBeforeQueueing(redis)
    now = time.time()
    with pytest.raises(ConnectionError):
        await dying.create_job("acme", _job("batch_a", now, 3), 10, active=True)
    job = await records.get_job("acme", "batch_a")
    assert job is not None and job["status"] == "validating"
    assert await redis.xlen(QUEUE) == 0  # type: ignore[attr-defined]
    # not yet stale: the API server may still be between its steps
    assert await records.requeue_stuck(now + 1, older_than=5) == []
    assert await records.requeue_stuck(now + 6, older_than=5) == [("acme", "batch_a")]
    # a second sweep (another runner) and the API's own late step queue nothing more
    assert await records.requeue_stuck(now + 7, older_than=5) == []
    assert await records.enqueue("acme", "batch_a") is False
    assert await redis.xlen(QUEUE) == 1  # type: ignore[attr-defined]
    await records.ensure_group()
    claim = await records.claim("r0", idle_ms=60_000, block_ms=10)
    assert claim is not None and (claim.tenant, claim.job_id) == ("acme", "batch_a")


async def test_a_normal_create_queues_once_and_leaves_no_intent(redis: object) -> None:
    records = Records(redis)
    assert await records.create_job("acme", _job("batch_b", time.time(), 1), 1, active=True) == "ok"
    assert await redis.xlen(QUEUE) == 1  # type: ignore[attr-defined]
    assert await redis.zcard(INTENTS) == 0  # type: ignore[attr-defined]
    # refused by the jobs-in-flight limit: no entry, no intent
    got = await records.create_job("acme", _job("batch_c", time.time(), 1), 1, active=True)
    assert got == "jobs"
    assert await redis.xlen(QUEUE) == 1  # type: ignore[attr-defined]
    assert await redis.zcard(INTENTS) == 0  # type: ignore[attr-defined]


async def test_intents_of_jobs_never_created_or_final_are_dropped(redis: object) -> None:
    records = Records(redis)
    now = time.time()
    await redis.zadd(INTENTS, {"acme/batch_ghost": now, "acme/batch_done": now})  # type: ignore[attr-defined]
    done = _job("batch_done", now, 1) | {"status": "cancelled"}
    assert await records.create_job("acme", done, 10, active=False) == "ok"
    assert await records.requeue_stuck(now + 6, older_than=5) == []
    left = await redis.zrange(INTENTS, 0, -1)  # type: ignore[attr-defined]
    assert [x.decode() for x in left] == ["acme/batch_ghost"]  # kept: its server may be slow
    assert await records.requeue_stuck(now + 5 * ORPHAN_FACTOR + 1, older_than=5) == []
    assert await redis.zcard(INTENTS) == 0  # type: ignore[attr-defined]
    assert await redis.xlen(QUEUE) == 0  # type: ignore[attr-defined]


@pytest.fixture
async def emulator(tmp_path: Path) -> AsyncIterator[int]:
    port = free_port()
    argv = [sys.executable, "-m", "backends.emulator", "--port", str(port), "--model", "m"]
    argv += ["--profile", "seed-2k", "--time-scale", "1.0", "--max-running-requests", "4"]
    child = ChildProcess(argv, log=tmp_path / "emulator.log")
    try:
        wait_for_port(port, timeout=30)
        yield port
    finally:
        child.close()


async def test_a_runner_runs_a_job_its_api_server_never_queued(
    tmp_path: Path, redis: object, emulator: int
) -> None:
    records, store, n = Records(redis), DirectoryStore(tmp_path / "files"), 4
    rows = [
        {
            "custom_id": f"z-{i}", "method": "POST", "url": EP,
            "body": {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": f"{i}"}]},
        }
        for i in range(n)
    ]  # fmt: skip

    async def once() -> AsyncIterator[bytes]:
        yield b"\n".join(json.dumps(r).encode() for r in rows)

    await store.put("acme", "file-in", once())
    with pytest.raises(ConnectionError):
        await DiesBeforeQueueing(redis).create_job(
            "acme", _job("batch_z", time.time(), n), 10, active=True
        )
    policy = BatchPolicy(
        service="batch-api", gateway="edge", pool="chat",
        runner=RunnerPolicy(max_concurrency=4, backoff=0.05, claim_idle=1.0),
    )  # fmt: skip
    registry = CollectorRegistry()
    runner = BatchRunner(
        RunnerSettings(policy, f"http://127.0.0.1:{emulator}", "test-requeue"),
        records, store, IdlePool(),  # type: ignore[arg-type]
        clock=time.time, registry=registry,
    )  # fmt: skip
    task = asyncio.create_task(runner.run())
    try:
        end = time.monotonic() + 60
        while True:
            got = await records.get_job("acme", "batch_z")
            assert got is not None
            if got["status"] in ("expired", "completed", "failed"):
                break
            assert time.monotonic() < end, got
            await asyncio.sleep(0.1)
    finally:
        await stop_task(task)  # type: ignore[arg-type]
    assert got["status"] == "completed" and int(got["completed"]) == n, got
    assert registry.get_sample_value("tokenweir_batch_requeued_jobs_total") == 1.0
