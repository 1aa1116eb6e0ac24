"""The batch runner: takes jobs from the Redis queue and feeds their lines into the pool through
the gateway, in the batch lane, while the pool has room (docs/batch.md).

Every line is an ordinary request of the job's tenant (its own API key): identity, quota,
admission, routing and usage settlement apply as to any request. Each carries
``Idempotency-Key: batch-<job>-<line>``: after a restart of this runner the line is sent again,
and the gateway's ``idempotency`` plugin replays the stored answer of a line that had finished
(no second run, no second charge); its result is written to Redis once (``HSETNX``). A job whose
runner dies stays pending in the stream; another runner claims it after ``claim_idle``.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge
from redis.exceptions import RedisError

from batch_service.errors import StoreError
from batch_service.files import FileStore
from batch_service.objects import ACTIVE, TERMINAL, error_line, output_line
from batch_service.pacer import Pacer, PoolView
from batch_service.records import Claim, Records
from batch_service.stepguard import StepGuard
from batch_service.stepmeter import StepMeter
from batch_service.validate import EMBEDDINGS, Line, parse_lines
from policy.batch import BATCH_LINE_HEADER, BatchPolicy
from poolstate.reader import PoolStateReader
from poolstate.valley import PUBLISH_EVERY_S, RunnerWord
from wire.contract import IDEMPOTENCY_IN_USE
from wire.jsontypes import JsonValue

__all__ = ["BatchRunner", "RunnerMetrics", "RunnerSettings"]

log = logging.getLogger("tokenweir.batch.runner")

LANE_HINT = "x-lane"  # the lane plugin's client hint (its default hint_header)
SHED = (429, 503)  # over quota, shed by admission: later, and the whole window backs off
IN_FLIGHT = 409  # the line is in flight under the same key: it alone is sent again later
UNLIMITED = 2**62


@dataclass(frozen=True)
class RunnerSettings:
    policy: BatchPolicy
    gateway_url: str  # http(s)://host:port of the gateway the lines enter
    consumer: str  # this runner's name in the consumer group
    line_timeout: float = 600.0
    gateway_ca: Path | None = None  # https: the CA bundle the gateway's certificate chains to
    lane_share: float = 1.0  # admission's max_share of the batch lane (the policy's)


class RunnerMetrics:
    """The runner's metrics (docs/batch.md "Metrics"; the dashboard and Grafana read them)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.lines = Counter(
            "tokenweir_batch_lines",
            "batch lines by outcome (completed, failed, shed, retried, expired, cancelled)",
            ["outcome"],
            registry=registry,
        )
        self.jobs = Counter(
            "tokenweir_batch_jobs", "jobs finished by this runner, by final status",
            ["status"], registry=registry,
        )  # fmt: skip
        self.inflight = Gauge(
            "tokenweir_batch_inflight", "batch lines in flight", registry=registry
        )
        self.window = Gauge(
            "tokenweir_batch_window", "batch lines allowed in flight now (the pacer)",
            registry=registry,
        )  # fmt: skip
        self.remaining = Gauge(
            "tokenweir_batch_remaining_lines", "lines of the running job not yet answered",
            registry=registry,
        )  # fmt: skip
        self.queued = Gauge(
            "tokenweir_batch_queued_jobs",
            "jobs in the queue, waiting or being run (every runner reports the same queue)",
            registry=registry,
        )
        self.requeued = Counter(
            "tokenweir_batch_requeued_jobs",
            "jobs an API server created but died before queueing, queued by this runner",
            registry=registry,
        )
        self.guard = Gauge(
            "tokenweir_batch_guard_streams",
            "batch streams the step guard allows on the pool now (-1: not binding: interactive "
            "idle, or the guard off)",
            registry=registry,
        )
        self.lag = Gauge(
            "tokenweir_batch_lag_seconds",
            "age of the job this runner works on (0 when idle): how far behind submission it is",
            registry=registry,
        )


class BatchRunner:
    def __init__(
        self,
        settings: RunnerSettings,
        records: Records,
        store: FileStore,
        pool_state: PoolStateReader,
        *,
        clock: Callable[[], float],
        registry: CollectorRegistry,
    ) -> None:
        self.s = settings
        self.records = records
        self.store = store
        self.pool_state = pool_state
        self.clock = clock
        self.m = RunnerMetrics(registry)
        r = settings.policy.runner
        self.guard = None if r.max_step_increase is None else StepGuard(r.max_step_increase)
        self.pacer = Pacer(
            r.max_concurrency, r.fill, r.backoff, guard=self.guard, lane_share=settings.lane_share
        )
        self._http: aiohttp.ClientSession | None = None
        # lines the pool answered since start, their prompt and completion tokens
        self._answered = [0, 0, 0]

    # ---- the loop ------------------------------------------------------------------------------
    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.s.line_timeout)
        tls = ssl.create_default_context(cafile=self.s.gateway_ca) if self.s.gateway_ca else None
        connector = aiohttp.TCPConnector(limit=0, ssl=tls if tls is not None else True)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
            self._http = http
            meter = None
            if self.guard is not None:
                meter = asyncio.create_task(
                    StepMeter(self.guard, self._endpoints, http, clock=self.clock).run(),
                    name="batch-step-meter",
                )
            try:
                await self._loop()
            finally:
                if meter is not None:
                    meter.cancel()

    async def _loop(self) -> None:
        while True:
            try:
                await self.records.ensure_group()
                break
            except (RedisError, OSError) as exc:
                log.warning("redis: %s; retrying", exc)
                await asyncio.sleep(1.0)
        idle = self.s.policy.runner.claim_idle
        idle_ms = int(idle * 1000)
        swept = float("-inf")
        while True:
            try:
                if self.clock() - swept >= idle / 3:
                    swept = self.clock()
                    for tenant, jid in await self.records.requeue_stuck(swept, idle):
                        log.warning("job %s/%s was left unqueued; queued it", tenant, jid)
                        self.m.requeued.inc()
                    self.m.queued.set(await self.records.queued_jobs())
                claim = await self.records.claim(self.s.consumer, idle_ms=idle_ms, block_ms=1000)
                if claim is not None:
                    await self._job(claim)
            except (RedisError, OSError, StoreError) as exc:
                log.warning("batch runner: %s: %s; retrying", type(exc).__name__, exc)
                await asyncio.sleep(self.s.policy.runner.backoff)

    def _pool(self) -> PoolView | None:
        state = self.pool_state.state
        p = state.pools.get(self.s.policy.pool)
        if p is None:
            return None
        fresh = tuple(ep for ep, r in p.endpoints.items() if not r.stale)
        return PoolView(p.capacity_running, p.running, p.saturation, p.queued, state.version, fresh)

    def _endpoints(self) -> list[str]:
        p = self.pool_state.state.pools.get(self.s.policy.pool)
        return [] if p is None else [ep for ep, r in p.endpoints.items() if not r.stale]

    # ---- one job -------------------------------------------------------------------------------
    async def _job(self, claim: Claim) -> None:
        t, jid = claim.tenant, claim.job_id
        job = await self.records.get_job(t, jid)
        if job is None or job["status"] in TERMINAL:
            await self.records.ack(claim.entry)
            return
        log.info("job %s/%s: %s", t, jid, job["status"])
        try:
            data = await self.store.get(t, job["input_file_id"])
        except StoreError as exc:
            await self._fail(claim, f"the input file cannot be read: {exc}")
            return
        lines, errors = parse_lines(data, job["endpoint"], {job["model"]}, UNLIMITED)
        if errors:  # the file changed under the job (it was valid at creation)
            await self._fail(claim, f"the input file no longer validates: {errors[0].message}")
            return
        status = job["status"]
        if status == "validating":
            await self.records.move(
                t, jid, ("validating",), "in_progress", {"in_progress_at": int(self.clock())}
            )
        if status in ("validating", "in_progress"):
            status = await self._feed(claim, job, lines)
        else:  # cancelling, or finalizing when its runner died
            status = job.get("final_status") or "cancelled"
        await self._finalize(claim, job, lines, status)

    async def _fail(self, claim: Claim, message: str) -> None:
        now = int(self.clock())
        err = [{"code": "input_file_error", "message": message, "param": None, "line": None}]
        await self.records.move(
            claim.tenant, claim.job_id, ACTIVE, "failed",
            {"failed_at": now, "errors": json.dumps(err)},
        )  # fmt: skip
        await self.records.finished(claim.tenant, claim.job_id)
        await self.records.ack(claim.entry)
        self.m.jobs.labels("failed").inc()

    async def _feed(self, claim: Claim, job: dict[str, str], lines: list[Line]) -> str:
        """Send every line not yet answered; the job's final status (completed, cancelled,
        expired)."""
        t, jid = claim.tenant, claim.job_id
        done = await self.records.done_lines(t, jid)
        pending = collections.deque(line for line in lines if line.index not in done)
        inflight: dict[asyncio.Task[bool], Line] = {}
        tries: collections.Counter[int] = collections.Counter()
        expires = float(job.get("expires_at") or UNLIMITED)
        created = float(job["created_at"])
        touched = checked = self.clock()
        published = float("-inf")
        outcome = "completed"
        stopping = False
        decodes = job["endpoint"] != EMBEDDINGS  # embeddings lines are no decode streams
        try:
            while pending or inflight:
                now = self.clock()
                self.m.lag.set(max(0.0, now - created))
                self.m.remaining.set(len(pending) + len(inflight))
                if now - touched >= self.s.policy.runner.claim_idle / 3:
                    await self.records.touch(self.s.consumer, claim)
                    self.m.queued.set(await self.records.queued_jobs())
                    touched = now
                if not stopping and now - checked >= 0.5:
                    checked = now
                    fresh = await self.records.get_job(t, jid)
                    if fresh is not None and fresh["status"] == "cancelling":
                        stopping, outcome = True, "cancelled"
                if not stopping and now >= expires:
                    stopping, outcome = True, "expired"
                if stopping and not inflight:
                    break
                if not stopping:
                    window = self.pacer.window(self._pool(), len(inflight), now, decodes=decodes)
                    self.m.window.set(window)
                    self.m.guard.set(-1 if self.pacer.cap is None else self.pacer.cap)
                    starts = self.pacer.starts(now, window - len(inflight))
                    while pending and starts > 0:
                        starts -= 1
                        line = pending.popleft()
                        task = asyncio.create_task(self._send(t, jid, job, line, tries))
                        inflight[task] = line
                self.m.inflight.set(len(inflight))
                if now - published >= PUBLISH_EVERY_S:
                    published = now
                    await self._publish(self.pacer.at_replicas(len(inflight)))
                if not inflight:
                    await asyncio.sleep(0.05)
                    continue
                finished, _ = await asyncio.wait(
                    inflight, timeout=0.05, return_when=asyncio.FIRST_COMPLETED
                )
                for task in finished:
                    line = inflight.pop(task)
                    if not task.result():  # to be sent again (shed, or a retriable failure)
                        pending.appendleft(line)
        finally:
            for task in inflight:
                task.cancel()
            await self._publish(0)
            self.m.inflight.set(0)
            self.m.lag.set(0)
            self.m.remaining.set(0)
        return outcome

    async def _publish(self, lines: int) -> None:
        """Our lines at the pool's replicas and those it answered (poolstate/valley.py): the
        degradation ladder does not read them as the pool's overload, nor the online planner
        as its demand. A Redis error skips one write (a reader stops counting a word
        ``MAX_AGE_S`` old: both read the plain pool then)."""
        a = self._answered
        word = RunnerWord(lines, time.time(), a[0], a[1], a[2])
        try:
            await self.records.publish_valley(self.s.policy.pool, self.s.consumer, word)
        except (RedisError, OSError) as exc:
            log.debug("the lines at the replicas were not published: %s", exc)

    async def _send(
        self, t: str, jid: str, job: dict[str, str], line: Line, tries: collections.Counter[int]
    ) -> bool:
        """One line through the gateway; True when its result is recorded."""
        assert self._http is not None
        headers = {
            "authorization": job.get("key", ""),
            "content-type": "application/json",
            LANE_HINT: "batch",
            BATCH_LINE_HEADER: "1",
            "idempotency-key": f"batch-{jid}-{line.index}",
        }
        url = self.s.gateway_url + job["endpoint"]
        try:
            async with self._http.post(url, data=json.dumps(line.body), headers=headers) as r:
                status, raw, rid = r.status, await r.read(), r.headers.get("x-request-id", "")
                retry_after = _seconds(r.headers.get("retry-after"))
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.info("line %d of %s: %s; again later", line.index, jid, exc)
            self.pacer.shed(self.clock())
            self.m.lines.labels("retried").inc()
            return False
        if status == IN_FLIGHT and _error_code(raw) == IDEMPOTENCY_IN_USE:
            # this line alone is in flight under its key (an earlier try the gateway still
            # holds): it waits, the window does not shrink for the other lines (measured: a
            # 409 a second paused the whole job for 30 s, docs/benchmarks.md). Any other 409
            # is final: ``idempotency_answer_not_stored`` (the line ran, its answer was too
            # large for the gateway to keep: asking again would wait forever) is its error line
            self.m.lines.labels("shed").inc()
            await asyncio.sleep(max(self.s.policy.runner.backoff, retry_after or 0.0))
            return False
        if status in SHED:
            self.pacer.shed(self.clock(), retry_after)
            self.m.lines.labels("shed").inc()
            return False
        if status >= 500:
            tries[line.index] += 1
            if tries[line.index] <= self.s.policy.runner.line_retries:
                # a part of the mesh restarting (a filter server: 500 while Envoy cannot reach
                # it) must not fail lines: the pauses double, 1+2+4+... backoffs in all
                pause = self.s.policy.runner.backoff * 2 ** (tries[line.index] - 1)
                self.pacer.shed(self.clock(), max(pause, retry_after or 0.0))
                self.m.lines.labels("retried").inc()
                return False
        ok = 200 <= status < 300
        try:
            body: JsonValue = json.loads(raw) if raw else None
        except ValueError:
            body = {"error": {"message": raw.decode("utf-8", "replace")[:2000]}}
        if not rid and isinstance(body, dict):
            rid = str(body.get("id", ""))
        out = output_line(jid, line.index, line.custom_id, status, rid, body)
        if await self.records.record_line(t, jid, line.index, out, ok):
            self.m.lines.labels("completed" if ok else "failed").inc()
        if ok:
            self.pacer.answered()
            self._count_answered(body)
        return True

    def _count_answered(self, body: JsonValue) -> None:
        """One line the pool answered, with its usage's tokens (the planner's subtraction)."""
        usage = body.get("usage") if isinstance(body, dict) else None
        prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        generated = usage.get("completion_tokens") if isinstance(usage, dict) else None
        a = self._answered
        a[0] += 1
        a[1] += prompt if isinstance(prompt, int) and prompt > 0 else 0
        a[2] += generated if isinstance(generated, int) and generated > 0 else 0

    async def _finalize(
        self, claim: Claim, job: dict[str, str], lines: list[Line], status: str
    ) -> None:
        t, jid = claim.tenant, claim.job_id
        now = int(self.clock())
        await self.records.move(
            t, jid, ACTIVE, "finalizing", {"finalizing_at": now, "final_status": status}
        )
        results = await self.records.results(t, jid)
        out: list[bytes] = []
        err: list[bytes] = []
        code = {"expired": "batch_expired", "cancelled": "batch_cancelled"}.get(status)
        for line in lines:
            got = results.get(line.index)
            if got is not None:
                (out if got[0] else err).append(got[1])
            elif code is not None:
                msg = f"this request was not run: the batch was {status} first"
                err.append(error_line(jid, line.index, line.custom_id, code, msg))
                self.m.lines.labels(status).inc()
        fields: dict[str, object] = {f"{status}_at": int(self.clock())}
        for kind, rows in (("output", out), ("error", err)):
            if rows:
                fields[f"{kind}_file_id"] = await self._store_output(t, jid, kind, rows)
        await self.records.move(t, jid, ("finalizing",), status, fields)
        await self.records.finished(t, jid)
        await self.records.ack(claim.entry)
        self.m.jobs.labels(status).inc()
        log.info("job %s/%s: %s (%d answered, %d errors)", t, jid, status, len(out), len(err))

    async def _store_output(self, tenant: str, jid: str, kind: str, rows: list[bytes]) -> str:
        """The output or error file, under an id fixed by the job (a second finalize after a
        crash rewrites the same file)."""
        fid = f"file-{jid}-{kind}"
        data = b"\n".join(rows) + b"\n"

        async def once() -> AsyncIterator[bytes]:
            yield data

        size = await self.store.put(tenant, fid, once())
        meta = {
            "id": fid, "bytes": size, "created_at": int(self.clock()),
            "filename": f"{jid}_{kind}.jsonl", "purpose": "batch_output",
        }  # fmt: skip
        await self.records.add_file(tenant, meta, UNLIMITED, UNLIMITED)  # outputs: not limited
        return fid


def _error_code(raw: bytes) -> str | None:
    """The OpenAI-style ``error.code`` of an answer's body, if it has one."""
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def _seconds(value: str | None) -> float | None:
    try:
        return None if value is None else float(value)
    except ValueError:
        return None
