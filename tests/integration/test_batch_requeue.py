"""A job created but never queued (its API server died between the two Redis calls) is queued
by a runner's sweep once its intent is older than ``runner.claim_idle``, exactly once; a real
Redis, and a runner that then runs the job against a real (emulated) replica (issue 41)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from batch_service.files import DirectoryStore
from batch_service.records import INTENTS, ORPHAN_FACTOR, QUEUE, Records
from runtime.redis_connect import connect_redis
from tests.integration.batch_jobs import (
    batch_runner,
    chat_lines,
    emulator_process,
    job_record,
    put_input,
    runner_policy,
    running,
    wait_ended,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class DiesBeforeQueueing(Records):
    """An API server killed right after it created the job, before it queued it."""

    async def enqueue(self, tenant: str, job_id: str) -> bool:
        raise ConnectionError("the API server died here")


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
        await dying.create_job("acme", job_record("batch_a", 3, created=now), 10, active=True)
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
    assert await records.create_job("acme", job_record("batch_b", 1), 1, active=True) == "ok"
    assert await redis.xlen(QUEUE) == 1  # type: ignore[attr-defined]
    assert await redis.zcard(INTENTS) == 0  # type: ignore[attr-defined]
    # refused by the jobs-in-flight limit: no entry, no intent
    got = await records.create_job("acme", job_record("batch_c", 1), 1, active=True)
    assert got == "jobs"
    assert await redis.xlen(QUEUE) == 1  # type: ignore[attr-defined]
    assert await redis.zcard(INTENTS) == 0  # type: ignore[attr-defined]


async def test_intents_of_jobs_never_created_or_final_are_dropped(redis: object) -> None:
    records = Records(redis)
    now = time.time()
    await redis.zadd(INTENTS, {"acme/batch_ghost": now, "acme/batch_done": now})  # type: ignore[attr-defined]
    done = job_record("batch_done", 1, created=now) | {"status": "cancelled"}
    assert await records.create_job("acme", done, 10, active=False) == "ok"
    assert await records.requeue_stuck(now + 6, older_than=5) == []
    left = await redis.zrange(INTENTS, 0, -1)  # type: ignore[attr-defined]
    assert [x.decode() for x in left] == ["acme/batch_ghost"]  # kept: its server may be slow
    assert await records.requeue_stuck(now + 5 * ORPHAN_FACTOR + 1, older_than=5) == []
    assert await redis.zcard(INTENTS) == 0  # type: ignore[attr-defined]
    assert await redis.xlen(QUEUE) == 0  # type: ignore[attr-defined]


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[int]:
    with emulator_process(tmp_path, 4) as port:
        yield port


async def test_a_runner_runs_a_job_its_api_server_never_queued(
    tmp_path: Path, redis: object, emulator: int
) -> None:
    records, store, n = Records(redis), DirectoryStore(tmp_path / "files"), 4
    await put_input(store, "acme", chat_lines(n, "z", max_tokens=8))
    with pytest.raises(ConnectionError):
        await DiesBeforeQueueing(redis).create_job(
            "acme", job_record("batch_z", n), 10, active=True
        )
    policy = runner_policy(max_concurrency=4, backoff=0.05, claim_idle=1.0)
    registry = CollectorRegistry()
    runner = batch_runner(
        policy, f"http://127.0.0.1:{emulator}", "test-requeue", records, store, registry=registry
    )
    async with running(runner):
        got = await wait_ended(records, "acme", "batch_z")
    assert got["status"] == "completed" and int(got["completed"]) == n, got
    assert registry.get_sample_value("tokenweir_batch_requeued_jobs_total") == 1.0
