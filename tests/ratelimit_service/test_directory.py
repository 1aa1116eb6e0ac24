"""The quota directory's cache: fresh for ``ttl``, then answered from the cache while one
background read refreshes it, then waited for again."""

from __future__ import annotations

import asyncio

import pytest

from policy.loader import load_policy_text
from policy.model import Policy
from quota.config import SubjectQuotas
from ratelimit_service.directory import QuotaDirectory

YAML = """
version: 1
tiers:
  t: {quotas: {tokens: {burst: 100, refill_per_second: 1}}}
tenants:
  acme: {tier: t}
"""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class SlowHash:
    """The live hash of ``acme``; each read waits until ``release`` is set."""

    def __init__(self) -> None:
        self.burst = "200"
        self.reads = 0
        self.release = asyncio.Event()

    async def hgetall(self, key: str) -> dict[bytes, bytes]:
        self.reads += 1
        await self.release.wait()
        return {b"tokens.burst": self.burst.encode()}


@pytest.fixture
def policy() -> Policy:
    return load_policy_text(YAML)


async def turns(n: int = 20) -> None:
    """Let the background read (a task inside a task: the fetch runs under ``wait_for``) run."""
    for _ in range(n):
        await asyncio.sleep(0)


def burst(sq: SubjectQuotas) -> int | None:
    return sq.quotas["tokens"].burst


async def test_a_stale_entry_answers_at_once_and_one_read_refreshes_it(policy: Policy) -> None:
    clock, live = Clock(), SlowHash()
    d = QuotaDirectory(policy, live.hgetall, ttl=0.5, fetch_timeout=5.0, clock=clock)
    live.release.set()
    assert burst(await d.tenant("acme")) == 200 and live.reads == 1
    live.release.clear()
    live.burst = "300"  # a live edit
    clock.now += 0.6  # stale, within the second ttl
    # the decisions do not wait for the (blocked) read; only one read is started
    got = [burst(await asyncio.wait_for(d.tenant("acme"), 0.5)) for _ in range(3)]
    await turns()
    assert got == [200, 200, 200] and live.reads == 2
    live.release.set()
    await turns()
    assert burst(await d.tenant("acme")) == 300 and live.reads == 2
    await d.aclose()


async def test_an_entry_older_than_twice_the_ttl_is_read_before_answering(policy: Policy) -> None:
    clock, live = Clock(), SlowHash()
    live.release.set()
    d = QuotaDirectory(policy, live.hgetall, ttl=0.5, clock=clock)
    assert burst(await d.tenant("acme")) == 200
    live.burst = "300"
    clock.now += 1.01
    assert burst(await d.tenant("acme")) == 300 and live.reads == 2
    await d.aclose()


async def test_ttl_zero_reads_every_time(policy: Policy) -> None:
    clock, live = Clock(), SlowHash()
    live.release.set()
    d = QuotaDirectory(policy, live.hgetall, ttl=0.0, clock=clock)
    assert burst(await d.tenant("acme")) == 200
    live.burst = "300"
    assert burst(await d.tenant("acme")) == 300 and live.reads == 2


async def test_close_stops_a_refresh_that_hangs(policy: Policy) -> None:
    clock, live = Clock(), SlowHash()
    live.release.set()
    d = QuotaDirectory(policy, live.hgetall, ttl=0.5, fetch_timeout=60.0, clock=clock)
    await d.tenant("acme")
    live.release.clear()
    clock.now += 0.6
    await d.tenant("acme")
    await turns()
    assert live.reads == 2
    await asyncio.wait_for(d.aclose(), 2.0)
