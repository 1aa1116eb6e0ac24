"""KeyStore: single flight, positive/negative caches, tombstones, last known answers while Redis
fails, throttled logs (fake clock, dict-backed fake Redis; no network)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError

from filters.api import Context
from filters.errors import ClientError, KeyServiceUnavailable
from filters.keys import REVOKED_SET, KeyInfo, KeyStore, key_digest, key_name
from filters.plugins.identity.plugin import IdentityPlugin
from runtime.throttled_log import ThrottledLog
from tests.filters.conftest import ROUTE, FakeClock, make_services

POLICY_KEY = "policy-key-0001"
POLICY = {POLICY_KEY: KeyInfo("acme", "pro")}


class FakeRedis:
    """HGETALL/SMEMBERS over dicts; ``fail`` raises, ``gate`` holds reads until it is set."""

    def __init__(self) -> None:
        self.hashes: dict[str, dict[str, str]] = {}
        self.revoked: set[str] = set()
        self.fail: BaseException | None = None
        self.gate: asyncio.Event | None = None
        self.reads = 0
        self.syncs = 0

    async def hgetall(self, name: str) -> dict[str, str]:
        self.reads += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return dict(self.hashes.get(name, {}))

    async def smembers(self, name: str) -> set[bytes]:
        assert name == REVOKED_SET
        self.syncs += 1
        if self.fail is not None:
            raise self.fail
        return {d.encode() for d in self.revoked}

    def issue(self, key: str, tenant: str) -> None:
        self.hashes[key_name(key)] = {"tenant": tenant}

    def revoke(self, key: str) -> None:
        self.hashes.setdefault(key_name(key), {})["disabled"] = "1"
        self.revoked.add(key_digest(key))


class Counts:
    def __init__(self) -> None:
        self.errors = 0
        self.fallbacks: list[str] = []

    def error(self) -> None:
        self.errors += 1


def store(redis: FakeRedis, clock: FakeClock, counts: Counts | None = None, **kw: Any) -> KeyStore:
    c = counts or Counts()
    return KeyStore(
        POLICY, redis, clock=clock, on_redis_error=c.error, on_fallback=c.fallbacks.append, **kw
    )


async def test_300_concurrent_lookups_of_one_key_are_one_redis_read() -> None:
    redis, clock = FakeRedis(), FakeClock()
    redis.issue("k1", "acme")
    redis.gate = asyncio.Event()
    ks = store(redis, clock)
    waiting = [asyncio.ensure_future(ks.lookup("k1")) for _ in range(300)]
    await asyncio.sleep(0)
    redis.gate.set()
    answers = await asyncio.gather(*waiting)
    assert answers == [KeyInfo("acme")] * 300
    assert redis.reads == 1 and redis.syncs == 1
    await ks.aclose()


async def test_a_cancelled_caller_does_not_cancel_the_shared_read() -> None:
    redis, clock = FakeRedis(), FakeClock()
    redis.issue("k1", "acme")
    redis.gate = asyncio.Event()
    ks = store(redis, clock)
    first = asyncio.ensure_future(ks.lookup("k1"))
    second = asyncio.ensure_future(ks.lookup("k1"))
    await asyncio.sleep(0)
    first.cancel()
    redis.gate.set()
    assert await second == KeyInfo("acme")
    assert redis.reads == 1
    await ks.aclose()


async def test_positive_and_negative_answers_are_cached_for_their_ttl() -> None:
    redis, clock = FakeRedis(), FakeClock()
    redis.issue("k1", "acme")
    ks = store(redis, clock, ttl=1.0, negative_ttl=3.0)
    assert await ks.lookup("k1") == KeyInfo("acme")
    assert await ks.lookup("nope") is None
    redis.revoke("k1")
    redis.issue("nope", "acme")
    clock.now += 0.9
    assert await ks.lookup("k1") == KeyInfo("acme")  # cached
    assert await ks.lookup("nope") is None
    assert redis.reads == 2
    clock.now += 0.2
    assert await ks.lookup("k1") is None  # revoked after the positive TTL
    assert await ks.lookup("nope") is None  # negative TTL not over yet
    clock.now += 2.0
    assert await ks.lookup("nope") == KeyInfo("acme")
    await ks.aclose()


async def test_redis_is_the_authority_for_keys_it_knows() -> None:
    redis, clock = FakeRedis(), FakeClock()
    ks = store(redis, clock, ttl=0.0, negative_ttl=0.0)
    assert await ks.lookup(POLICY_KEY) == KeyInfo("acme", "pro")  # Redis does not know it
    redis.hashes[key_name(POLICY_KEY)] = {"tenant": "other"}
    assert await ks.lookup(POLICY_KEY) == KeyInfo("other", "pro")  # tier from the policy
    redis.revoke(POLICY_KEY)
    assert await ks.lookup(POLICY_KEY) is None  # a tombstone beats the policy file
    await ks.aclose()


async def test_outage_answers_the_last_known_answer_per_key_however_old() -> None:
    redis, clock, counts = FakeRedis(), FakeClock(), Counts()
    redis.issue("valid", "acme")
    redis.revoke(POLICY_KEY)
    ks = store(redis, clock, counts)
    assert await ks.lookup("valid") == KeyInfo("acme")
    assert await ks.lookup(POLICY_KEY) is None
    redis.fail = MaxConnectionsError("Too many connections")
    clock.now += 3600.0
    for _ in range(50):
        assert await ks.lookup("valid") == KeyInfo("acme")  # never a wrong 401
        assert await ks.lookup(POLICY_KEY) is None  # never a revoked key let in
    assert redis.reads == 3  # after one failed read Redis is left alone for retry_after
    assert set(counts.fallbacks) == {"last_known"}
    await ks.aclose()


async def test_redis_is_retried_after_retry_after_and_answers_again() -> None:
    redis, clock, counts = FakeRedis(), FakeClock(), Counts()
    redis.issue("valid", "acme")
    ks = store(redis, clock, counts, retry_after=2.0)
    assert await ks.lookup("valid") == KeyInfo("acme")
    redis.fail = RedisConnectionError("refused")
    clock.now += 5.0
    assert await ks.lookup("valid") == KeyInfo("acme")
    reads = redis.reads
    clock.now += 1.0
    assert await ks.lookup("valid") == KeyInfo("acme")
    assert redis.reads == reads  # within retry_after: no read
    redis.fail = None
    redis.revoke("valid")
    clock.now += 1.5
    assert await ks.lookup("valid") is None  # Redis back: its answer again
    await ks.aclose()


async def test_a_timeout_counts_as_a_failure() -> None:
    redis, clock, counts = FakeRedis(), FakeClock(), Counts()
    ks = store(redis, clock, counts, io_timeout=0.01)
    await ks.sync_tombstones()
    redis.gate = asyncio.Event()  # never set: Redis hangs
    assert await ks.lookup(POLICY_KEY) == KeyInfo("acme", "pro")
    assert counts.errors == 1 and counts.fallbacks == ["policy"]
    await ks.aclose()


async def test_before_the_first_tombstone_read_a_policy_key_is_not_vouched_for() -> None:
    """Redis fails from the start: this process cannot know whether the policy key was
    revoked, so it answers 503 (retry), not the policy file."""
    redis, clock, counts = FakeRedis(), FakeClock(), Counts()
    redis.revoke(POLICY_KEY)
    redis.fail = RedisConnectionError("refused")
    ks = store(redis, clock, counts)
    with pytest.raises(KeyServiceUnavailable):
        await ks.lookup(POLICY_KEY)
    redis.fail = None
    clock.now += 2.0
    assert await ks.lookup(POLICY_KEY) is None
    await ks.aclose()


async def test_tombstones_hold_a_revoked_policy_key_this_process_never_read() -> None:
    redis, clock, counts = FakeRedis(), FakeClock(), Counts()
    redis.issue("other", "acme")
    redis.revoke(POLICY_KEY)
    ks = store(redis, clock, counts)
    assert await ks.lookup("other") == KeyInfo("acme")  # first lookup also syncs tombstones
    await asyncio.sleep(0)
    redis.fail = RedisConnectionError("refused")
    clock.now += 10.0
    assert await ks.lookup(POLICY_KEY) is None
    assert counts.fallbacks == ["tombstone"]
    await ks.aclose()


async def test_a_newer_tombstone_beats_an_older_last_known_answer() -> None:
    redis, clock = FakeRedis(), FakeClock()
    ks = store(redis, clock, tombstone_sync=5.0)
    assert await ks.lookup(POLICY_KEY) == KeyInfo("acme", "pro")
    clock.now += 6.0
    redis.revoke(POLICY_KEY)
    await ks.sync_tombstones()
    redis.fail = RedisConnectionError("refused")
    clock.now += 1.0
    assert await ks.lookup(POLICY_KEY) is None
    await ks.aclose()


async def test_unknown_key_during_an_outage_is_503_not_401(caplog: Any) -> None:
    redis, clock, counts = FakeRedis(), FakeClock(), Counts()
    redis.fail = RedisConnectionError("refused")
    ks = store(redis, clock, counts)
    with pytest.raises(KeyServiceUnavailable):
        await ks.lookup("issued-through-redis")
    assert counts.fallbacks == ["unavailable"]
    await ks.aclose()


async def test_identity_answers_503_with_retry_after_when_the_key_store_is_down(
    policy: Any, clock: FakeClock
) -> None:
    redis = FakeRedis()
    redis.fail = RedisConnectionError("refused")
    services = make_services(policy, clock, redis=redis)
    with pytest.raises(ClientError) as info:
        await IdentityPlugin({}, services).request_headers(
            Context(route=ROUTE, started=0.0),
            {"authorization": "Bearer issued-through-redis"},
            False,
        )
    assert info.value.status == 503 and ("retry-after", "1") in info.value.headers


async def test_failures_are_logged_once_per_interval_with_a_count(caplog: Any) -> None:
    redis, clock = FakeRedis(), FakeClock()
    redis.fail = RedisConnectionError("refused")
    ks = store(redis, clock, retry_after=0.0, log_interval=10.0)
    with caplog.at_level(logging.WARNING, logger="filters.keys"):
        for _ in range(200):
            with contextlib.suppress(KeyServiceUnavailable):
                await ks.lookup(POLICY_KEY)
            clock.now += 0.01
        clock.now += 10.0
        with contextlib.suppress(KeyServiceUnavailable):
            await ks.lookup(POLICY_KEY)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "refused" in lines[0] and "more like it in the last 10s" in lines[1]
    await ks.aclose()


def test_throttled_log_counts_what_it_held_back(caplog: Any) -> None:
    clock = FakeClock()
    log = ThrottledLog(clock, 5.0, logging.getLogger("t"))
    with caplog.at_level(logging.WARNING, logger="t"):
        for _ in range(3):
            log.warning("x %s", 1)
        clock.now += 5.0
        log.warning("x %s", 2)
    assert [r.getMessage() for r in caplog.records] == [
        "x 1",
        "x 2 (2 more like it in the last 5s)",
    ]


async def test_the_cache_is_bounded_oldest_first() -> None:
    redis, clock = FakeRedis(), FakeClock()
    for k in ("a", "b", "c"):
        redis.issue(k, "acme")
    ks = store(redis, clock, max_entries=2)
    for k in ("a", "b", "c"):
        await ks.lookup(k)
    redis.fail = RedisConnectionError("refused")
    clock.now += 5.0
    assert await ks.lookup("c") == KeyInfo("acme")
    with pytest.raises(KeyServiceUnavailable):
        await ks.lookup("a")  # evicted: nothing known about it
    await ks.aclose()


async def test_a_key_redis_does_not_know_follows_the_current_policy_file() -> None:
    """Redis had no entry for a policy key: after a reload that drops the key it is refused,
    also from the cache and during an outage (the old policy's answer is not 'last known')."""
    redis, clock = FakeRedis(), FakeClock()
    ks = store(redis, clock)
    assert await ks.lookup(POLICY_KEY) == KeyInfo("acme", "pro")
    ks.update_fallback({})
    assert await ks.lookup(POLICY_KEY) is None  # cached entry, current policy
    redis.fail = RedisConnectionError("refused")
    clock.now += 5.0
    assert await ks.lookup(POLICY_KEY) is None
    ks.update_fallback(POLICY)
    assert await ks.lookup(POLICY_KEY) == KeyInfo("acme", "pro")
    await ks.aclose()
