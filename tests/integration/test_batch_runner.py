"""The batch runner against a real Redis and a real (emulated) SGLang replica: a job that
cannot finish in its window expires with partial output, as OpenAI's do (issue 41)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from redis.exceptions import RedisError

from batch_service.files import DirectoryStore
from batch_service.records import Records
from batch_service.runner import BatchRunner, RunnerSettings
from policy.batch import BatchPolicy
from policy.batch import BatchRunner as RunnerPolicy
from poolstate.state import PoolState, PoolSummary
from runtime.redis_connect import connect_redis
from runtime.tasks import stop_task
from tests.helpers import ChildProcess, free_port, wait_for_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

EP = "/v1/chat/completions"


class IdlePool:
    """The pool-state reader's one property the runner reads: an idle pool of 100 slots."""

    @property
    def state(self) -> PoolState:
        return PoolState(1, time.time(), {"chat": PoolSummary({}, 100, 0)})


@pytest.fixture
async def emulator(tmp_path: Path) -> AsyncIterator[int]:
    port = free_port()
    argv = [sys.executable, "-m", "backends.emulator", "--port", str(port), "--model", "m"]
    argv += ["--profile", "seed-2k", "--time-scale", "1.0", "--max-running-requests", "2"]
    child = ChildProcess(argv, log=tmp_path / "emulator.log")
    try:
        wait_for_port(port, timeout=30)
        yield port
    finally:
        child.close()


async def test_a_job_past_its_window_expires_with_partial_output(
    tmp_path: Path, redis_port: int, emulator: int
) -> None:
    redis = await connect_redis(f"redis://127.0.0.1:{redis_port}/0", timeout=2.0)
    records, store = Records(redis), DirectoryStore(tmp_path / "files")
    tenant, n = f"t{secrets.token_hex(4)}", 24  # ~6 s of work at 2 in flight: past 3 s
    rows = [
        {
            "custom_id": f"x-{i}", "method": "POST", "url": EP,
            "body": {"model": "m", "max_tokens": 48, "messages": [{"role": "user", "content": f"{i}"}]},
        }
        for i in range(n)
    ]  # fmt: skip
    data = b"\n".join(json.dumps(r).encode() for r in rows)

    async def once() -> AsyncIterator[bytes]:
        yield data

    await store.put(tenant, "file-in", once())
    now = int(time.time())
    job = {
        "id": "batch_x", "endpoint": EP, "input_file_id": "file-in", "completion_window": "24h",
        "created_at": now, "status": "validating", "total": n, "completed": 0, "failed": 0,
        "expires_at": now + 3, "model": "m", "key": "", "metadata": "",
    }  # fmt: skip
    assert await records.create_job(tenant, job, 10, active=True) == "ok"
    policy = BatchPolicy(
        service="batch-api", gateway="edge", pool="chat",
        runner=RunnerPolicy(max_concurrency=2, backoff=0.05, claim_idle=2.0),
    )  # fmt: skip
    runner = BatchRunner(
        RunnerSettings(policy, f"http://127.0.0.1:{emulator}", f"test-{tenant}"),
        records, store, IdlePool(),  # type: ignore[arg-type]
        clock=time.time, registry=CollectorRegistry(),
    )  # fmt: skip
    task = asyncio.create_task(runner.run())
    try:
        end = time.monotonic() + 60
        while True:
            got = await records.get_job(tenant, "batch_x")
            assert got is not None
            if got["status"] in ("expired", "completed", "failed"):
                break
            assert time.monotonic() < end, got
            await asyncio.sleep(0.1)
    finally:
        await stop_task(task)  # type: ignore[arg-type]
    assert got["status"] == "expired", got
    assert got.get("expired_at") and got.get("output_file_id") and got.get("error_file_id")
    out = [json.loads(x) for x in (await store.get(tenant, got["output_file_id"])).splitlines()]
    err = [json.loads(x) for x in (await store.get(tenant, got["error_file_id"])).splitlines()]
    assert 0 < len(out) < n and int(got["completed"]) == len(out)
    assert {e["error"]["code"] for e in err} == {"batch_expired"}
    assert all(e["response"] is None for e in err)
    assert Counter(x["custom_id"] for x in out + err) == Counter(f"x-{i}" for i in range(n))
    assert await redis.sismember(f"tw:batch:{{{tenant}}}:active", "batch_x") == 0
    await redis.aclose()


async def test_a_job_survives_redis_killed_mid_job(tmp_path: Path, emulator: int) -> None:
    """Redis (append-only, fsync always) killed with SIGKILL and started again mid-job: the
    runner rides it out, takes its job back and every line is answered and recorded once."""
    port = free_port()
    data_dir = tmp_path / "redis"
    data_dir.mkdir()
    argv = [
        "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
        "--appendonly", "yes", "--appendfsync", "always", "--dir", str(data_dir),
    ]  # fmt: skip
    server = ChildProcess(argv, log=tmp_path / "redis-1.log")
    wait_for_port(port, timeout=30)
    redis = await connect_redis(f"redis://127.0.0.1:{port}/0", timeout=2.0)
    records, store = Records(redis), DirectoryStore(tmp_path / "files")
    tenant, n = "acme", 16
    rows = [
        {
            "custom_id": f"y-{i}", "method": "POST", "url": EP,
            "body": {"model": "m", "max_tokens": 32, "messages": [{"role": "user", "content": f"{i}"}]},
        }
        for i in range(n)
    ]  # fmt: skip
    body = b"\n".join(json.dumps(r).encode() for r in rows)

    async def once() -> AsyncIterator[bytes]:
        yield body

    await store.put(tenant, "file-in", once())
    now = int(time.time())
    job = {
        "id": "batch_y", "endpoint": EP, "input_file_id": "file-in", "completion_window": "24h",
        "created_at": now, "status": "validating", "total": n, "completed": 0, "failed": 0,
        "expires_at": now + 3600, "model": "m", "key": "", "metadata": "",
    }  # fmt: skip
    assert await records.create_job(tenant, job, 10, active=True) == "ok"
    policy = BatchPolicy(
        service="batch-api", gateway="edge", pool="chat",
        runner=RunnerPolicy(max_concurrency=2, backoff=0.1, claim_idle=2.0),
    )  # fmt: skip
    runner = BatchRunner(
        RunnerSettings(policy, f"http://127.0.0.1:{emulator}", "test-redis-kill"),
        records, store, IdlePool(),  # type: ignore[arg-type]
        clock=time.time, registry=CollectorRegistry(),
    )  # fmt: skip
    task = asyncio.create_task(runner.run())
    try:
        end = time.monotonic() + 60
        while int((await records.get_job(tenant, "batch_y") or {}).get("completed", 0)) < 3:
            assert time.monotonic() < end
            await asyncio.sleep(0.05)
        at_kill = int((await records.get_job(tenant, "batch_y") or {})["completed"])
        os.killpg(server.proc.pid, signal.SIGKILL)  # no shutdown: what fsync kept is all
        server.close()
        await asyncio.sleep(1.0)
        server = ChildProcess(argv, log=tmp_path / "redis-2.log")
        wait_for_port(port, timeout=30)
        while True:
            got = await _job_or_none(records, tenant)
            if got is not None and got["status"] in ("completed", "failed", "expired"):
                break
            assert time.monotonic() < end + 30, got
            await asyncio.sleep(0.1)
    finally:
        await stop_task(task)  # type: ignore[arg-type]
        await redis.aclose()
        server.close()
    assert at_kill < n, "the job ended before Redis was killed"
    assert got["status"] == "completed", got
    assert (int(got["completed"]), int(got["failed"])) == (n, 0)
    out = [json.loads(x) for x in (await store.get(tenant, got["output_file_id"])).splitlines()]
    assert Counter(x["custom_id"] for x in out) == Counter(f"y-{i}" for i in range(n))


async def _job_or_none(records: Records, tenant: str) -> dict[str, str] | None:
    try:
        return await records.get_job(tenant, "batch_y")
    except (RedisError, OSError):
        return None
