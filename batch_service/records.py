"""Jobs, files and progress in Redis: the state every API server and runner shares.

Keys carry the tenant as a hash tag (``{tenant}``), so one tenant's keys sit in one Redis
Cluster slot and each Lua script below touches one slot:

    tw:batch:{T}:file:<id>   hash   a file's metadata (id, bytes, created_at, filename, purpose)
    tw:batch:{T}:files       zset   the tenant's file ids by creation time
    tw:batch:{T}:bytes       string the tenant's stored bytes together
    tw:batch:{T}:job:<id>    hash   a job: its OpenAI fields, status, counters, the caller's key
    tw:batch:{T}:jobs        zset   the tenant's job ids by creation time
    tw:batch:{T}:active      set    jobs not finished (the jobs-in-flight limit counts these)
    tw:batch:{T}:res:<id>    hash   line index -> its result line, written once (HSETNX)
    tw:batch:queue           stream jobs to run; consumer group ``runners`` (a runner that dies
                                    leaves its entry pending; another claims it when idle)
    {tw:batch:queue}:intents zset   jobs about to be queued ("tenant/job" by time): the same slot
                                    as the stream (its hash tag is the stream's name)

Limits are checked and charged in the same script that adds the file or job (no race).

Creating a job and queueing it touch two slots (the tenant's, the queue's), so no one script can
do both in Redis Cluster. Instead the API writes an *intent* beside the queue first, then the
job, then queues it with a script that removes the intent and adds the stream entry together
(:meth:`Records.create_job`). An API server that dies between the steps leaves the intent; a
runner's sweep (:meth:`Records.requeue_stuck`) queues a job whose intent is older than a
timeout through that same script, so the job is queued exactly once, by whoever removes the
intent first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from batch_service.objects import TERMINAL
from poolstate.valley import KEY_TTL_S, RunnerWord, valley_key

__all__ = ["GROUP", "INTENTS", "QUEUE", "Claim", "Records", "decode_hash"]

QUEUE = "tw:batch:queue"
GROUP = "runners"
INTENTS = "{tw:batch:queue}:intents"  # hash tag = the stream's whole name: one slot with it
ORPHAN_FACTOR = 10  # an intent whose job never appeared goes after this many timeouts

_ENQUEUE = """
-- KEYS: intents zset, queue stream; ARGV: member (tenant/job), tenant, job
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return false end
return redis.call('XADD', KEYS[2], '*', 'tenant', ARGV[2], 'job', ARGV[3])
"""

_ADD_FILE = """
-- KEYS: meta, files zset, bytes; ARGV: id, created_at, size, max files, max bytes, json meta
if redis.call('EXISTS', KEYS[1]) == 1 then return 'exists' end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[4]) then return 'files' end
local used = tonumber(redis.call('GET', KEYS[3]) or '0')
if used + tonumber(ARGV[3]) > tonumber(ARGV[5]) then return 'bytes' end
local meta = cjson.decode(ARGV[6])
for k, v in pairs(meta) do redis.call('HSET', KEYS[1], k, tostring(v)) end
redis.call('ZADD', KEYS[2], tonumber(ARGV[2]), ARGV[1])
redis.call('INCRBY', KEYS[3], tonumber(ARGV[3]))
return 'ok'
"""

_DELETE_FILE = """
-- KEYS: meta, files zset, bytes; ARGV: id
local size = redis.call('HGET', KEYS[1], 'bytes')
if not size then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('DECRBY', KEYS[3], tonumber(size))
return 1
"""

_CREATE_JOB = """
-- KEYS: job, jobs zset, active set; ARGV: id, created_at, max in flight, json fields, active?
if redis.call('EXISTS', KEYS[1]) == 1 then return 'exists' end
if ARGV[5] == '1' and redis.call('SCARD', KEYS[3]) >= tonumber(ARGV[3]) then return 'jobs' end
local fields = cjson.decode(ARGV[4])
for k, v in pairs(fields) do redis.call('HSET', KEYS[1], k, tostring(v)) end
redis.call('ZADD', KEYS[2], tonumber(ARGV[2]), ARGV[1])
if ARGV[5] == '1' then redis.call('SADD', KEYS[3], ARGV[1]) end
return 'ok'
"""

_RECORD_LINE = """
-- KEYS: results, job; ARGV: index, line, counter field
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
return 1
"""

_MOVE_STATUS = """
-- KEYS: job; ARGV: allowed statuses (comma separated), new status, json fields
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return false end
local ok = false
for s in string.gmatch(ARGV[1], '[^,]+') do if s == status then ok = true end end
if not ok then return status end
redis.call('HSET', KEYS[1], 'status', ARGV[2])
local fields = cjson.decode(ARGV[3])
for k, v in pairs(fields) do redis.call('HSET', KEYS[1], k, tostring(v)) end
return 'ok'
"""


def _member(tenant: str, job_id: str) -> str:
    return f"{tenant}/{job_id}"


def decode_hash(raw: Mapping[bytes | str, bytes | str]) -> dict[str, str]:
    """A hash as redis-py gives it (bytes, or str when the client decodes) as text."""
    return {_s(k): _s(v) for k, v in raw.items()}


def _s(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _stream_entries(reply: object, at: tuple[int, ...]) -> list[tuple[str, dict[str, str]]]:
    """The (id, fields) entries inside a stream reply (RESP2), found at index path ``at``:
    XREADGROUP's ``[[stream, entries]]`` at (0, 1), XAUTOCLAIM's ``[next, entries, deleted]``
    at (1,); none when the reply is empty. A trimmed entry has no fields (None)."""
    node = reply
    for i in at:
        if not isinstance(node, list | tuple) or len(node) <= i:
            return []
        node = node[i]
    entries: list[tuple[str, dict[str, str]]] = []
    for entry_id, fields in node if isinstance(node, list) else []:
        entries.append((_s(entry_id), decode_hash(fields or {})))
    return entries


@dataclass(frozen=True, slots=True)
class Claim:
    """One queue entry a runner holds: the job ``tenant``/``job_id``."""

    entry: str
    tenant: str
    job_id: str


class Records:
    """All Redis I/O of the batch service; callers get plain dicts and raise their own errors."""

    def __init__(self, redis: Redis | RedisCluster) -> None:
        self.redis = redis
        self._add_file = redis.register_script(_ADD_FILE)
        self._delete_file = redis.register_script(_DELETE_FILE)
        self._create_job = redis.register_script(_CREATE_JOB)
        self._record_line = redis.register_script(_RECORD_LINE)
        self._move_status = redis.register_script(_MOVE_STATUS)
        self._enqueue = redis.register_script(_ENQUEUE)

    # ---- keys ----------------------------------------------------------------------------------
    @staticmethod
    def _k(tenant: str, rest: str) -> str:
        return f"tw:batch:{{{tenant}}}:{rest}"

    # ---- files ---------------------------------------------------------------------------------
    async def add_file(
        self, tenant: str, meta: Mapping[str, object], max_files: int, max_bytes: int
    ) -> str:
        """``ok``, or what a limit refused: ``files``, ``bytes`` (``exists``: the id is taken)."""
        fid = str(meta["id"])
        keys = [self._k(tenant, f"file:{fid}"), self._k(tenant, "files"), self._k(tenant, "bytes")]
        # str(): the bytes redis-py would send for the int itself
        args: list[str | int] = [
            fid,
            str(meta["created_at"]),
            str(meta["bytes"]),
            max_files,
            max_bytes,
            json.dumps(meta),
        ]
        return _s(await self._add_file(keys=keys, args=args))

    async def get_file(self, tenant: str, file_id: str) -> dict[str, str] | None:
        raw = await self.redis.hgetall(self._k(tenant, f"file:{file_id}"))
        return decode_hash(raw) if raw else None

    async def list_files(self, tenant: str) -> list[dict[str, str]]:
        ids = await self.redis.zrevrange(self._k(tenant, "files"), 0, -1)
        out = []
        for fid in ids:
            meta = await self.get_file(tenant, _s(fid))
            if meta is not None:
                out.append(meta)
        return out

    async def delete_file(self, tenant: str, file_id: str) -> bool:
        keys = [
            self._k(tenant, f"file:{file_id}"),
            self._k(tenant, "files"),
            self._k(tenant, "bytes"),
        ]
        return bool(await self._delete_file(keys=keys, args=[file_id]))

    async def tenant_bytes(self, tenant: str) -> int:
        return int(await self.redis.get(self._k(tenant, "bytes")) or 0)

    # ---- jobs ----------------------------------------------------------------------------------
    async def create_job(
        self, tenant: str, fields: Mapping[str, object], max_in_flight: int, *, active: bool
    ) -> str:
        """``ok``, ``jobs`` (the in-flight limit refused it) or ``exists``. An ``active`` job is
        also queued for the runners: intent, job, then the intent turned into a stream entry
        (a crash between the steps is repaired by :meth:`requeue_stuck`)."""
        jid = str(fields["id"])
        member = _member(tenant, jid)
        if active:
            await self.redis.zadd(INTENTS, {member: float(str(fields["created_at"]))})
        keys = [self._k(tenant, f"job:{jid}"), self._k(tenant, "jobs"), self._k(tenant, "active")]
        args: list[str | int] = [
            jid,
            str(fields["created_at"]),  # the bytes redis-py would send for the int itself
            max_in_flight,
            json.dumps(fields),
            "1" if active else "0",
        ]
        got = _s(await self._create_job(keys=keys, args=args))
        if active:
            if got == "ok":
                await self.enqueue(tenant, jid)
            else:  # refused: nothing to queue
                await self.redis.zrem(INTENTS, member)
        return got

    async def enqueue(self, tenant: str, job_id: str) -> bool:
        """Turn the job's intent into a queue entry; False if the intent was gone (someone
        queued the job already)."""
        got = await self._enqueue(
            keys=[INTENTS, QUEUE], args=[_member(tenant, job_id), tenant, job_id]
        )
        return got is not None

    async def requeue_stuck(self, now: float, older_than: float) -> list[tuple[str, str]]:
        """Queue the jobs whose API server died before queueing them: intents older than
        ``older_than`` seconds whose job is not final. An intent whose job never appeared (the
        server died before creating it) is dropped after ``ORPHAN_FACTOR`` times as long; a
        final job's intent at once. The jobs queued here, as (tenant, job id)."""
        raw = await self.redis.zrangebyscore(INTENTS, "-inf", now - older_than)
        queued = []
        for m in raw:
            member = _s(m)
            tenant, _, jid = member.rpartition("/")
            job = await self.get_job(tenant, jid)
            if job is not None and job.get("status") not in TERMINAL:
                if await self.enqueue(tenant, jid):
                    queued.append((tenant, jid))
                continue
            if job is None:
                score = await self.redis.zscore(INTENTS, member)
                if score is None or now - float(score) < ORPHAN_FACTOR * older_than:
                    continue
            await self.redis.zrem(INTENTS, member)
        return queued

    async def get_job(self, tenant: str, job_id: str) -> dict[str, str] | None:
        raw = await self.redis.hgetall(self._k(tenant, f"job:{job_id}"))
        return decode_hash(raw) if raw else None

    async def list_jobs(self, tenant: str) -> list[str]:
        return [_s(j) for j in await self.redis.zrevrange(self._k(tenant, "jobs"), 0, -1)]

    async def move(
        self, tenant: str, job_id: str, allowed: tuple[str, ...], status: str,
        fields: Mapping[str, object] | None = None,
    ) -> str | None:  # fmt: skip
        """Set ``status`` (and ``fields``) if the job's status is one of ``allowed``: ``ok``, the
        status that stopped it, or None (no such job)."""
        got = await self._move_status(
            keys=[self._k(tenant, f"job:{job_id}")],
            args=[",".join(allowed), status, json.dumps(dict(fields or {}))],
        )
        return None if got is None else _s(got)

    async def set_fields(self, tenant: str, job_id: str, fields: Mapping[str, object]) -> None:
        await self.redis.hset(
            self._k(tenant, f"job:{job_id}"), mapping={k: str(v) for k, v in fields.items()}
        )

    async def finished(self, tenant: str, job_id: str) -> None:
        """The job no longer counts against the tenant's jobs in flight; its results go."""
        await self.redis.srem(self._k(tenant, "active"), job_id)
        await self.redis.delete(self._k(tenant, f"res:{job_id}"))

    # ---- progress ------------------------------------------------------------------------------
    async def record_line(
        self, tenant: str, job_id: str, index: int, line: bytes, ok: bool
    ) -> bool:
        """Keep line ``index``'s result once (True the first time) and count it."""
        keys = [self._k(tenant, f"res:{job_id}"), self._k(tenant, f"job:{job_id}")]
        counter = "completed" if ok else "failed"
        tagged = (b"o" if ok else b"e") + line
        return bool(await self._record_line(keys=keys, args=[index, tagged, counter]))

    async def done_lines(self, tenant: str, job_id: str) -> set[int]:
        return {int(k) for k in await self.redis.hkeys(self._k(tenant, f"res:{job_id}"))}

    async def results(self, tenant: str, job_id: str) -> dict[int, tuple[bool, bytes]]:
        raw = await self.redis.hgetall(self._k(tenant, f"res:{job_id}"))
        tagged = {int(k): v if isinstance(v, bytes) else v.encode() for k, v in raw.items()}
        return {k: (v[:1] == b"o", v[1:]) for k, v in tagged.items()}

    # ---- the runners' queue --------------------------------------------------------------------
    async def ensure_group(self) -> None:
        try:
            await self.redis.xgroup_create(QUEUE, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def claim(self, consumer: str, *, idle_ms: int, block_ms: int) -> Claim | None:
        """A job this consumer held before it restarted first, then one left by a runner
        silent for ``idle_ms``, else a new one (waits up to ``block_ms``)."""
        mine = await self.redis.xreadgroup(GROUP, consumer, {QUEUE: "0"}, count=1)
        entries = _stream_entries(mine, (0, 1))
        if not entries:
            got = await self.redis.xautoclaim(QUEUE, GROUP, consumer, idle_ms, "0-0", count=1)
            entries = _stream_entries(got, (1,))
        if not entries:
            read = await self.redis.xreadgroup(
                GROUP, consumer, {QUEUE: ">"}, count=1, block=block_ms
            )
            entries = _stream_entries(read, (0, 1))
        for entry_id, f in entries:
            if "tenant" in f and "job" in f:
                return Claim(entry_id, f["tenant"], f["job"])
            await self.ack(entry_id)  # a deleted entry (trimmed): nothing to run
        return None

    async def queued_jobs(self) -> int:
        """Jobs in the queue: waiting for a runner or being run (an entry goes when its job is
        final)."""
        return int(await self.redis.xlen(QUEUE))

    async def touch(self, consumer: str, claim: Claim) -> None:
        """Still working on it: reset the entry's idle time so no other runner takes it."""
        await self.redis.xclaim(QUEUE, GROUP, consumer, 0, [claim.entry], justid=True)

    async def ack(self, entry: str) -> None:
        await self.redis.xack(QUEUE, GROUP, entry)
        await self.redis.xdel(QUEUE, entry)

    # ---- the runners' lines on the pool (the ladder's and the planner's) ----------------------
    async def publish_valley(self, pool: str, consumer: str, word: RunnerWord) -> None:
        """This runner's lines on ``pool`` now (poolstate/valley.py)."""
        key = valley_key(pool)
        async with self.redis.pipeline(transaction=False) as p:
            p.hset(key, consumer, word.encode())
            p.pexpire(key, int(KEY_TTL_S * 1000))
            await p.execute()
