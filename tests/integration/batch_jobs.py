"""What the batch integration tests share: the SGLang emulator as a process, batch input lines,
a job put straight into Redis (its input file in a directory store) for a runner to take, a
runner on an idle pool, waiting for a job to end and reading its output; and the same steps
through the OpenAI Batch API with the official ``openai`` client."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from redis.exceptions import RedisError

from batch_service.files import DirectoryStore
from batch_service.records import Records
from batch_service.runner import BatchRunner, RunnerSettings
from policy.batch import BatchPolicy
from policy.batch import BatchRunner as RunnerPolicy
from poolstate.state import PoolState, PoolSummary
from runtime.tasks import stop_task
from tests.helpers import ChildProcess, free_port, wait_for_port

if TYPE_CHECKING:
    from openai import OpenAI
    from openai.types import Batch

EP = "/v1/chat/completions"
FINAL = ("completed", "failed", "expired", "cancelled")
ENDED = ("expired", "completed", "failed")  # what a runner ends a job with (cancel aside)


class IdlePool:
    """The pool-state reader's one property the runner reads: an idle pool of 100 slots."""

    @property
    def state(self) -> PoolState:
        return PoolState(1, time.time(), {"chat": PoolSummary({}, 100, 0)})


@contextlib.contextmanager
def emulator_process(
    tmp_path: Path, slots: int, *, model: str = "m", extra: Sequence[str] = ()
) -> Iterator[int]:
    """The SGLang emulator (seed-2k, real time) with ``slots`` running requests at most, as a
    process on a free port (its log ``emulator.log`` in ``tmp_path``); stopped on exit."""
    port = free_port()
    argv = [sys.executable, "-m", "backends.emulator", "--port", str(port), "--model", model,
            "--profile", "seed-2k", "--time-scale", "1.0", "--max-running-requests", str(slots),
            *extra]  # fmt: skip
    child = ChildProcess(argv, log=tmp_path / "emulator.log")
    try:
        wait_for_port(port, timeout=30)
        yield port
    finally:
        child.close()


def chat_lines(
    n: int,
    prefix: str,
    *,
    model: str = "m",
    max_tokens: int = 16,
    content: str = "{i}",
    **body: object,
) -> bytes:
    """``n`` batch input lines (JSONL) of chat requests, ``custom_id`` ``{prefix}-{i}``; the
    message is ``content`` formatted with ``i`` and ``prefix``; ``body``: more request keys."""
    rows = [
        {"custom_id": f"{prefix}-{i}", "method": "POST", "url": EP,
         "body": {"model": model, "max_tokens": max_tokens, **body, "messages": [
             {"role": "user", "content": content.format(i=i, prefix=prefix)}]}}
        for i in range(n)
    ]  # fmt: skip
    return b"\n".join(json.dumps(r).encode() for r in rows) + b"\n"


def job_record(
    jid: str, n: int, *, created: float | None = None, expires_in: int = 3600, **fields: object
) -> dict[str, object]:
    """A new job's record as the API server writes it: ``n`` lines of ``file-in``, model ``m``
    (``fields`` override any key, e.g. ``model`` or ``key``)."""
    now = int(time.time() if created is None else created)
    job: dict[str, object] = {
        "id": jid, "endpoint": EP, "input_file_id": "file-in", "completion_window": "24h",
        "created_at": now, "status": "validating", "total": n, "completed": 0, "failed": 0,
        "expires_at": now + expires_in, "model": "m", "key": "", "metadata": "",
    }  # fmt: skip
    return job | fields


async def put_input(store: DirectoryStore, tenant: str, data: bytes) -> None:
    """``data`` stored as the tenant's file ``file-in`` (the one :func:`job_record` names)."""

    async def once() -> AsyncIterator[bytes]:
        yield data

    await store.put(tenant, "file-in", once())


async def submit_job(
    records: Records, store: DirectoryStore, tenant: str, data: bytes, job: dict[str, object]
) -> None:
    """What the API server does for a new job: its input file stored, the job created (in
    flight, queued for a runner)."""
    await put_input(store, tenant, data)
    assert await records.create_job(tenant, job, 10, active=True) == "ok"


def runner_policy(
    max_concurrency: int,
    backoff: float,
    claim_idle: float,
    max_step_increase: float | None = RunnerPolicy.max_step_increase,
) -> BatchPolicy:
    """The batch section of a mesh whose gateway ``edge`` sends lines to pool ``chat``."""
    runner = RunnerPolicy(
        max_concurrency=max_concurrency, backoff=backoff, claim_idle=claim_idle,
        max_step_increase=max_step_increase,
    )  # fmt: skip
    return BatchPolicy(service="batch-api", gateway="edge", pool="chat", runner=runner)


def batch_runner(
    policy: BatchPolicy,
    gateway: str,
    consumer: str,
    records: Records,
    store: DirectoryStore,
    pool: object | None = None,
    *,
    clock: Callable[[], float] = time.time,
    registry: CollectorRegistry | None = None,
) -> BatchRunner:
    """A runner sending lines to ``gateway`` (a URL) on ``pool`` (anything with the reader's
    ``state`` property; an :class:`IdlePool` when None)."""
    return BatchRunner(
        RunnerSettings(policy, gateway, consumer), records, store,
        IdlePool() if pool is None else pool,  # type: ignore[arg-type]  # the reader's one property
        clock=clock, registry=CollectorRegistry() if registry is None else registry,
    )  # fmt: skip


@contextlib.asynccontextmanager
async def running(runner: BatchRunner) -> AsyncIterator[None]:
    """``runner`` running as a task while the block runs; stopped after it."""
    task = asyncio.create_task(runner.run())
    try:
        yield
    finally:
        await stop_task(task)  # type: ignore[arg-type]


async def wait_ended(
    records: Records, tenant: str, jid: str, timeout: float = 60.0, *, outage: bool = False
) -> dict[str, str]:
    """The job once a runner ended it (:data:`ENDED`), read every 0.1 s for ``timeout`` s at
    most. ``outage``: Redis may be down meanwhile (a read that fails is read again)."""
    end = time.monotonic() + timeout
    while True:
        try:
            got = await records.get_job(tenant, jid)
        except (RedisError, OSError):
            if not outage:
                raise
            got = None
        else:
            assert got is not None or outage
        if got is not None and got["status"] in ENDED:
            return got
        assert time.monotonic() < end, got
        await asyncio.sleep(0.1)


async def read_lines(store: DirectoryStore, tenant: str, file_id: str) -> list[dict[str, Any]]:
    """The JSON lines of a job's output or error file (decoded JSON, read by the tests)."""
    return [json.loads(x) for x in (await store.get(tenant, file_id)).splitlines()]


# -- through the OpenAI Batch API (`tokenweir up` on examples/mesh.yaml) ----------------------
# (``openai`` and the example's policy are imported where used: batch_runner_child.py, a
# process the drills kill and start again, imports this module and should start fast)


def batch_policy(tmp: Path) -> tuple[Path, int]:
    """examples/mesh.yaml (written to ``tmp``; one chat replica, no sidecar) with its runner's
    claims and the lines' idempotency records freed soon; the path and the gateway's port."""
    from tests.integration.example_mesh import example_policy

    text, gw = example_policy(replicas=1, sidecar=False)  # no check reads the others, the sidecar
    # a dead runner's job is taken back soon; an interrupted line's claim frees soon
    text = text.replace("backoff: 1s}", "backoff: 200ms, claim_idle: 3s}")
    assert "claim_idle: 3s" in text
    text += "\nidempotency: {inflight_ttl: 3s, lease: 1s}\n"
    path = tmp / "mesh.yaml"
    path.write_text(text)
    return path, gw


def submit(client: OpenAI, data: bytes) -> str:
    """``data`` uploaded and a batch of it created; the batch's id."""
    f = client.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch")
    assert f.purpose == "batch" and f.bytes == len(data)
    b = client.batches.create(input_file_id=f.id, endpoint=EP, completion_window="24h")
    assert b.status == "validating" and b.input_file_id == f.id
    return b.id


def wait(client: OpenAI, bid: str, until: Callable[[Batch], bool], timeout: float = 180.0) -> Batch:
    """The batch once ``until`` holds, read every 0.2 s for ``timeout`` s at most."""
    import openai

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            b = client.batches.retrieve(bid)
        except (openai.InternalServerError, openai.APIConnectionError):
            time.sleep(0.2)  # a part of the mesh restarting (the kills below): poll again
            continue
        if until(b):
            return b
        time.sleep(0.2)
    raise AssertionError(f"batch {bid} stuck: {client.batches.retrieve(bid)}")


def lines_of(client: OpenAI, file_id: str | None) -> list[dict[str, object]]:
    """The JSON lines of a batch's output or error file (none without one)."""
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines() if x]
