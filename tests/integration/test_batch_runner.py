"""The batch runner against a real Redis and a real (emulated) SGLang replica: a job that
cannot finish in its window expires with partial output, as OpenAI's do (issue 41)."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from batch_service.files import DirectoryStore
from batch_service.records import Records
from runtime.redis_connect import connect_redis
from tests.helpers import ChildProcess, free_port, wait_for_port
from tests.integration.batch_jobs import (
    batch_runner,
    chat_lines,
    emulator_process,
    job_record,
    read_lines,
    runner_policy,
    running,
    submit_job,
    wait_ended,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[int]:
    with emulator_process(tmp_path, 2) as port:
        yield port


async def test_a_job_past_its_window_expires_with_partial_output(
    tmp_path: Path, redis_port: int, emulator: int
) -> None:
    redis = await connect_redis(f"redis://127.0.0.1:{redis_port}/0", timeout=2.0)
    records, store = Records(redis), DirectoryStore(tmp_path / "files")
    tenant, n = f"t{secrets.token_hex(4)}", 24  # ~6 s of work at 2 in flight: past 3 s
    data = chat_lines(n, "x", max_tokens=48)
    await submit_job(records, store, tenant, data, job_record("batch_x", n, expires_in=3))
    policy = runner_policy(max_concurrency=2, backoff=0.05, claim_idle=2.0)
    runner = batch_runner(policy, f"http://127.0.0.1:{emulator}", f"test-{tenant}", records, store)
    async with running(runner):
        got = await wait_ended(records, tenant, "batch_x")
    assert got["status"] == "expired", got
    assert got.get("expired_at") and got.get("output_file_id") and got.get("error_file_id")
    out = await read_lines(store, tenant, got["output_file_id"])
    err = await read_lines(store, tenant, got["error_file_id"])
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
    await submit_job(
        records, store, tenant, chat_lines(n, "y", max_tokens=32), job_record("batch_y", n)
    )
    policy = runner_policy(max_concurrency=2, backoff=0.1, claim_idle=2.0)
    runner = batch_runner(policy, f"http://127.0.0.1:{emulator}", "test-redis-kill", records, store)
    try:
        async with running(runner):
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
            left = end + 30 - time.monotonic()  # 30 s past the first wait's end
            got = await wait_ended(records, tenant, "batch_y", left, outage=True)
    finally:
        await redis.aclose()
        server.close()
    assert at_kill < n, "the job ended before Redis was killed"
    assert got["status"] == "completed", got
    assert (int(got["completed"]), int(got["failed"])) == (n, 0)
    out = await read_lines(store, tenant, got["output_file_id"])
    assert Counter(x["custom_id"] for x in out) == Counter(f"y-{i}" for i in range(n))
