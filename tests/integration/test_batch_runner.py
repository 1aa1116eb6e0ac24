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
from aiohttp import web

from batch_service.files import DirectoryStore
from batch_service.records import Records
from poolstate.valley import KEY_TTL_S, fresh_total, valley_key
from runtime.redis_connect import connect_redis
from tests.helpers import ChildProcess, free_port, serving, wait_for_port
from tests.integration.batch_jobs import (
    ENDED,
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
    # ~12 s of work at 2 in flight: past its 6 s (on a loaded box a 3 s window once ended
    # before the runner had answered a line, and there was no partial output to check)
    tenant, n = f"t{secrets.token_hex(4)}", 48
    data = chat_lines(n, "x", max_tokens=48)
    await submit_job(records, store, tenant, data, job_record("batch_x", n, expires_in=6))
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


async def test_a_409_whose_answer_is_not_kept_is_an_error_line_not_a_wait(
    tmp_path: Path, redis_port: int
) -> None:
    """The gateway's idempotency 409s differ: ``idempotency_key_in_use`` (an earlier try still
    runs: ask again later for its answer) and ``idempotency_answer_not_stored`` (it ran, its
    answer was too large to keep: final). The runner waited on every 409, so a line of the second
    kind was asked for again forever and its job never ended. Here a stand-in gateway (aiohttp
    on loopback) answers line 1 in-use once, then 200; line 2 not-stored, always."""
    asked: Counter[str] = Counter()

    async def answer(request: web.Request) -> web.Response:
        key = request.headers["idempotency-key"]
        asked[key] += 1
        line = int(key.rsplit("-", 1)[1])
        if line == 1 and asked[key] == 1:
            return _openai_error(409, "idempotency_key_in_use", retry_after="0")
        if line == 2:
            return _openai_error(409, "idempotency_answer_not_stored")
        body = {"id": f"r{line}", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"},
             "finish_reason": "stop"}]}  # fmt: skip
        return web.json_response(body)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    redis = await connect_redis(f"redis://127.0.0.1:{redis_port}/0", timeout=2.0)
    records, store = Records(redis), DirectoryStore(tmp_path / "files")
    tenant, n = f"t{secrets.token_hex(4)}", 4
    async with serving(app) as port:
        await submit_job(records, store, tenant, chat_lines(n, "x"), job_record("batch_409", n))
        policy = runner_policy(max_concurrency=4, backoff=0.05, claim_idle=2.0)
        runner = batch_runner(policy, f"http://127.0.0.1:{port}", f"t-{tenant}", records, store)
        async with running(runner):
            got = await wait_ended(records, tenant, "batch_409", timeout=30.0)
    assert got["status"] == "completed", got
    assert (int(got["completed"]), int(got["failed"])) == (3, 1), got
    err = await read_lines(store, tenant, got["error_file_id"])
    assert [(e["custom_id"], e["response"]["status_code"]) for e in err] == [("x-2", 409)]
    assert err[0]["response"]["body"]["error"]["code"] == "idempotency_answer_not_stored"
    assert asked["batch-batch_409-2"] == 1  # not asked again
    assert asked["batch-batch_409-1"] == 2  # asked again once the earlier try was done
    await redis.aclose()


def _openai_error(status: int, code: str, retry_after: str | None = None) -> web.Response:
    headers = {"retry-after": retry_after} if retry_after is not None else None
    body = {"error": {"message": code, "type": "invalid_request_error", "code": code}}
    return web.json_response(body, status=status, headers=headers)


async def test_the_runner_publishes_its_lines_at_the_replicas_for_the_ladder(
    tmp_path: Path, redis_port: int, emulator: int
) -> None:
    """While a job runs the runner writes how many of its lines are at the pool's replicas
    (poolstate/valley.py; the degradation ladder leaves them out of the pool's saturation),
    at most its lines in flight; 0 once the job is over."""
    redis = await connect_redis(f"redis://127.0.0.1:{redis_port}/0", timeout=2.0)
    records, store = Records(redis), DirectoryStore(tmp_path / "files")
    await redis.delete(valley_key("chat"))
    tenant, n = f"t{secrets.token_hex(4)}", 24
    await submit_job(records, store, tenant, chat_lines(n, "v", max_tokens=32),
                     job_record("batch_v", n))  # fmt: skip
    policy = runner_policy(max_concurrency=4, backoff=0.05, claim_idle=2.0)
    consumer = f"test-{tenant}"
    runner = batch_runner(policy, f"http://127.0.0.1:{emulator}", consumer, records, store)
    seen: list[int] = []
    async with running(runner):
        end = time.monotonic() + 60
        while (await records.get_job(tenant, "batch_v") or {}).get("status") not in ENDED:
            assert time.monotonic() < end, "the job did not end"
            fields = await redis.hgetall(valley_key("chat"))
            seen.append(fresh_total(fields, time.time()))
            await asyncio.sleep(0.05)
        got = await wait_ended(records, tenant, "batch_v")
    assert got["status"] == "completed"
    assert max(seen) > 0 and max(seen) <= 4  # at most its lines in flight
    last = await redis.hget(valley_key("chat"), consumer)
    assert last is not None and last.split()[0] == b"0"
    assert 0 < await redis.pttl(valley_key("chat")) <= KEY_TTL_S * 1000
    await redis.delete(valley_key("chat"))
    await redis.aclose()
