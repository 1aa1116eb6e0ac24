"""Effective quotas per subject: policy defaults overlaid by the live Redis hash, cached per
process (fresh for ``ttl`` seconds, then refreshed in the background while the cached value still
answers for another ``ttl``: ``redis-cli HSET`` takes effect within ``2 * ttl``, one second), and
the seeding of policy defaults into Redis that never overwrites live edits."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from policy.model import Policy
from quota.config import (
    SubjectQuotas,
    effective_quotas,
    service_defaults,
    tenant_defaults,
)
from quota.keys import config_key, seed_key, service_subject
from quota.reader import decode_map
from ratelimit_service.resp import RespReply
from ratelimit_service.store import load_script
from runtime.tasks import honour_cancel, stop_task

__all__ = ["QuotaDirectory", "SeedPlan", "seed_defaults", "seed_plan"]

log = logging.getLogger(__name__)
_MAX_ENTRIES = 100_000


class QuotaDirectory:
    """``tenant(name)`` / ``service(name)`` → SubjectQuotas. ``fetch`` reads a live hash (HGETALL);
    without it (or while Redis is down, see ``available``) the policy defaults plus the last live
    values seen are used.

    A cached value is fresh for ``ttl`` seconds. For the next ``ttl`` it still answers at once
    while one background task reads the hash again (a busy subject's decisions never wait for
    that read: it was a second Redis round trip in series with the reservation for one decision
    in five at 10 decisions/s per tenant); older than ``2 * ttl``, a decision waits for the read
    as on a first sight."""

    def __init__(
        self,
        policy: Policy,
        fetch: Callable[[str], Awaitable[dict[RespReply, RespReply]]] | None,
        *,
        ttl: float = 0.5,
        fetch_timeout: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        available: Callable[[], bool] = lambda: True,
    ) -> None:
        self._policy = policy
        self._fetch = fetch
        self._ttl = ttl
        self._timeout = fetch_timeout
        self._clock = clock
        self._available = available
        self._cache: dict[tuple[str, str], tuple[float, SubjectQuotas]] = {}
        self._live: dict[tuple[str, str], dict[str, str]] = {}
        self._pending: dict[tuple[str, str], asyncio.Future[SubjectQuotas]] = {}
        self._refreshing: dict[tuple[str, str], asyncio.Task[SubjectQuotas]] = {}

    @property
    def policy(self) -> Policy:
        return self._policy

    def update_policy(self, policy: Policy) -> None:
        self._policy = policy
        self._cache.clear()

    async def aclose(self) -> None:
        """Stop the background refreshes still running."""
        for task in list(self._refreshing.values()):
            await stop_task(task, log=log)
        self._refreshing.clear()

    async def tenant(self, name: str) -> SubjectQuotas:
        return await self._get(("t", name))

    async def service(self, name: str) -> SubjectQuotas:
        return await self._get(("s", name))

    async def _get(self, key: tuple[str, str]) -> SubjectQuotas:
        hit = self._cache.get(key)
        if hit is not None:
            left = hit[0] - self._clock()
            if left > 0:
                return hit[1]
            if left > -self._ttl and self._fetch is not None:  # stale: answer, read again aside
                if key not in self._refreshing and key not in self._pending:
                    task = asyncio.get_running_loop().create_task(self._refresh(key))
                    self._refreshing[key] = task
                return hit[1]
        pending = self._pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[SubjectQuotas] = asyncio.get_running_loop().create_future()
        self._pending[key] = fut
        try:
            sq = await self._load(key)
            fut.set_result(sq)
            return sq
        finally:
            del self._pending[key]
            if not fut.done():
                fut.cancel()

    async def _refresh(self, key: tuple[str, str]) -> SubjectQuotas:
        try:
            return await self._load(key)
        finally:
            self._refreshing.pop(key, None)

    async def _load(self, key: tuple[str, str]) -> SubjectQuotas:
        kind, name = key
        subject = name if kind == "t" else service_subject(name)
        if self._fetch is not None and self._available():
            try:
                raw = await asyncio.wait_for(self._fetch(config_key(subject)), self._timeout)
                self._live[key] = decode_map(raw)
            except Exception as exc:  # Redis down or slow: defaults and the last live values seen
                log.debug("live quotas of %s unavailable: %s", subject, exc)
        defaults = (
            tenant_defaults(self._policy, name)
            if kind == "t"
            else service_defaults(self._policy, name)
        )
        sq = effective_quotas(defaults, self._live.get(key, {}))
        if sq.problems:
            log.warning("ignoring bad live quota fields of %s: %s", subject, "; ".join(sq.problems))
        if len(self._cache) > _MAX_ENTRIES:
            self._cache.clear()
            self._live.clear()
        self._cache[key] = (self._clock() + self._ttl, sq)
        return sq


SeedPlan = list[tuple[list[str], list[str]]]


def seed_plan(policy: Policy) -> SeedPlan:
    """``(keys, args)`` of seed.lua for every tenant and service (pure: a reload computes it off
    the event loop)."""
    subjects: list[tuple[str, dict[str, str]]] = []
    for name in policy.tenants:
        subjects.append((name, tenant_defaults(policy, name) or {}))
    for name in policy.services:
        subjects.append((service_subject(name), service_defaults(policy, name) or {}))
    return [
        ([config_key(subject), seed_key(subject)], [x for kv in sorted(fields.items()) for x in kv])
        for subject, fields in subjects
    ]


async def seed_defaults(
    client: Redis | RedisCluster,
    policy: Policy,
    *,
    plan: SeedPlan | None = None,
    batch: int = 200,
    rest: float = 0.0,
) -> int:
    """Copy the policy's quota defaults of every tenant and service into Redis (seed.lua); returns
    how many fields changed. Live edits are kept. ``batch`` subjects go in one pipeline (100k
    tenants are 500 round trips, not 100k, and the event loop runs between them); Redis Cluster
    gets one call per subject. ``rest``: after each pipeline, wait this many times as long as it
    took (a reload while serving: decisions and the filter server's reads get Redis in between;
    a 200-script pipeline held Redis long enough to fail 50 ms rate-limit calls)."""
    script = client.register_script(load_script("seed"))
    calls = plan if plan is not None else seed_plan(policy)
    changed = 0
    if isinstance(client, RedisCluster):
        for keys, args in calls:
            changed += int(await script(keys=keys, args=args))
        return changed
    loop = asyncio.get_running_loop()
    for start in range(0, len(calls), batch):
        began = loop.time()
        pipe = client.pipeline(transaction=False)
        for keys, args in calls[start : start + batch]:
            await script(keys=keys, args=args, client=pipe)  # queued, sent by execute()
        changed += sum(int(n) for n in await pipe.execute())
        honour_cancel()  # redis-py's pipeline can swallow a cancel that lands mid-execute
        if rest:
            await asyncio.sleep((loop.time() - began) * rest)
    return changed
