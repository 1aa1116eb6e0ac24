"""A Retry-After's promise kept by any filter process (``filters/plugins/admission/shared.py``): two
gates, as two filter processes sharing one pool, over a real Redis; a client shed by one and
back when told at the other goes first there, once; early, late, or with Redis gone, it is
fresh (each process's own promises, as without sharing)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from filters.plugins.admission.core import Admission, Shed
from filters.plugins.admission.gate import AdmissionMetrics, PoolGate
from filters.plugins.admission.queues import Ticket
from filters.plugins.admission.shared import PREFIX, SharedReturns, promise_name
from tests.filters.admission.test_core import admission, ticket

pytestmark = pytest.mark.timeout(30)


class Clock:
    """One clock for both processes: monotonic ``now`` and a wall clock 1e9 s ahead."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.t + 1e9


def test_the_core_takes_a_client_another_process_promised_as_returning() -> None:
    a = admission(1, queue=1, per_tenant=1)
    ticket(a.offer(0.0, "interactive", "h"))  # the one slot
    assert not a.starts_at_once(0.0, "interactive")
    ticket(a.offer(0.0, "interactive", "w"))  # the one queue place
    fresh = a.offer(0.1, "interactive", "x", key="kx")
    assert isinstance(fresh, Shed) and fresh.reason == "queue_full"
    back = ticket(a.offer(0.2, "interactive", "y", key="ky", returned=True))
    # past the lane's bound, before the fresh one queued earlier
    assert back.returning and a.queues["interactive"].peek() is back
    assert a.told["interactive"].claimed == 0  # no promise of this process was kept
    empty = admission(1)
    assert empty.starts_at_once(0.0, "interactive")


def test_a_promise_says_when_it_may_be_claimed() -> None:
    a = admission(1, queue=1, per_tenant=1)
    ticket(a.offer(0.0, "interactive", "h"))
    ticket(a.offer(0.0, "interactive", "w"))
    shed = a.offer(1.0, "interactive", "x", key="kx")
    assert isinstance(shed, Shed)
    told = a.told["interactive"]
    early, until = told.window_of("kx")  # type: ignore[misc]
    assert early < 1.0 + shed.retry_after < until
    assert not told.claimable(early - 0.01, "kx") and told.claimable(early, "kx")
    assert told.claimable(until, "kx") and not told.claimable(until + 0.01, "kx")
    assert told.window_of("other") is None


@pytest.fixture
async def redis(redis_port: int) -> AsyncIterator[aioredis.Redis]:
    r = aioredis.Redis(port=redis_port)
    for k in await r.keys(PREFIX + "*"):
        await r.delete(k)
    yield r
    await settle_writes()
    await r.aclose()


_OPEN: list[SharedReturns] = []  # this test's, their background writes awaited after it


async def settle_writes() -> None:
    for shared in _OPEN:
        await shared.aclose()
    _OPEN.clear()


def two_processes(
    redis: aioredis.Redis, clock: Clock
) -> tuple[PoolGate, PoolGate, list[CollectorRegistry]]:
    """Two gates of one slot and one queue place each, sharing their promises."""
    gates, registries = [], []
    for _ in range(2):
        reg = CollectorRegistry()
        core: Admission = admission(1, queue=1, per_tenant=1, wait=3.0)
        g = PoolGate("chat", core, clock=clock, metrics=AdmissionMetrics(reg))
        g.shared = SharedReturns(redis, wall=clock.wall, registry=reg)
        g.shared.on_kept = lambda _pool, lane, key, g=g: g.kept_elsewhere(lane, key)
        _OPEN.append(g.shared)
        gates.append(g)
        registries.append(reg)
    return gates[0], gates[1], registries


def count(reg: CollectorRegistry, outcome: str) -> float:
    v = reg.get_sample_value("tokenweir_admission_shared_returns_total", {"outcome": outcome})
    return v or 0.0


async def fill(g: PoolGate) -> tuple[Ticket, asyncio.Task[Ticket | Shed]]:
    """Its slot taken and its queue place taken: the holder's ticket, the waiter's task."""
    holder = ticket(await g.acquire("interactive", "holder"))
    assert holder.state == "admitted"
    waiter = asyncio.create_task(g.acquire("interactive", "waiter"))
    await asyncio.sleep(0)
    assert len(g.core.queues["interactive"]) == 1
    return holder, waiter


async def shed_at(g: PoolGate, key: str, tenant: str = "x") -> Shed:
    r = await g.acquire("interactive", tenant, key=key)
    assert isinstance(r, Shed) and r.reason == "queue_full"
    await asyncio.sleep(0.05)  # the background write
    return r


async def test_a_client_shed_by_one_process_goes_first_at_the_other(
    redis: aioredis.Redis,
) -> None:
    clock = Clock()
    a, b, (ra, rb) = two_processes(redis, clock)
    (_, wa), (held_b, wb) = await fill(a), await fill(b)
    shed = await shed_at(a, "kx")
    assert count(ra, "published") == 1
    assert await redis.exists(promise_name("chat", "interactive", "kx"))
    # b's own fresh arrival is turned away: its queue is full
    assert isinstance(await b.acquire("interactive", "z", key="kz"), Shed)
    await asyncio.sleep(0.05)
    clock.t += shed.retry_after
    back = asyncio.create_task(b.acquire("interactive", "x", key="kx"))
    await asyncio.sleep(0.05)
    assert not back.done()  # queued past the lane's bound, not shed
    q = b.core.queues["interactive"]
    assert len(q) == 2 and q.peek().returning and q.peek().tenant == "x"
    assert count(rb, "taken") == 1
    assert not await redis.exists(promise_name("chat", "interactive", "kx"))  # kept once
    # a hears of it: the promise is no longer due there, nor claimable, and counts as kept
    told_a = a.core.told["interactive"]
    assert told_a.claimable(clock.t, "kx") and told_a.claimed == 0
    assert a.shared is not None and await a.shared.poll() == 1
    assert not told_a.claimable(clock.t, "kx") and told_a.window_of("kx") is None
    assert told_a.claimed == 1 and count(ra, "kept_elsewhere") == 1
    assert await a.shared.poll() == 0  # told once
    # b's slot frees: the client back when told starts before b's own waiter
    b.release(held_b)
    got = ticket(await asyncio.wait_for(back, 1.0))
    assert got.state == "admitted" and got.returning
    assert not wb.done()
    # the same request again at another process: the promise is gone, it is fresh
    again = await b.acquire("interactive", "x", key="kx")
    assert isinstance(again, Shed)
    for w in (wa, wb):
        w.cancel()


async def test_early_late_and_unknown_clients_are_fresh_and_an_early_one_keeps_its_place(
    redis: aioredis.Redis,
) -> None:
    clock = Clock()
    a, b, (_, rb) = two_processes(redis, clock)
    waiters = [(await fill(a))[1], (await fill(b))[1]]
    shed = await shed_at(a, "kx")
    early, until = a.core.told["interactive"].window_of("kx")  # type: ignore[misc]
    clock.t = early - 0.5
    assert isinstance(await b.acquire("interactive", "x", key="kx"), Shed)  # too early
    await asyncio.sleep(0.05)
    assert await redis.exists(promise_name("chat", "interactive", "kx"))  # still promised
    assert isinstance(await b.acquire("interactive", "u", key="unknown"), Shed)
    assert count(rb, "taken") == 0 and count(rb, "missed") >= 2
    clock.t = until + 0.5  # too late: dropped
    late = await b.acquire("interactive", "x", key="kx")
    assert isinstance(late, Shed)
    assert count(rb, "taken") == 0
    assert shed.retry_after > 0
    for w in waiters:
        w.cancel()


async def test_a_pool_with_room_does_not_ask_redis(redis: aioredis.Redis) -> None:
    clock = Clock()
    a, b, (_, rb) = two_processes(redis, clock)
    _, waiter = await fill(a)
    shed = await shed_at(a, "kx")
    clock.t += shed.retry_after
    got = ticket(await b.acquire("interactive", "x", key="kx"))  # b is idle: starts at once
    assert got.state == "admitted" and not got.returning
    assert count(rb, "taken") + count(rb, "missed") == 0
    waiter.cancel()


async def test_redis_gone_means_each_process_keeps_its_own_promises(redis_port: int) -> None:
    from tests.helpers import free_port

    clock = Clock()
    dead = aioredis.Redis(port=free_port(), socket_connect_timeout=0.2)
    a, b, (ra, rb) = two_processes(dead, clock)
    waiters = [(await fill(a))[1], (await fill(b))[1]]
    shed = await shed_at(a, "kx")
    await asyncio.sleep(0.3)
    assert count(ra, "error") >= 1  # the write failed, counted
    clock.t += shed.retry_after
    fresh = await b.acquire("interactive", "x", key="kx")
    assert isinstance(fresh, Shed) and fresh.reason == "queue_full"  # b never heard of it
    assert count(rb, "error") == 1
    back = asyncio.create_task(a.acquire("interactive", "x", key="kx"))
    await asyncio.sleep(0.05)
    assert not back.done() and a.core.queues["interactive"].peek().returning  # a still knows
    back.cancel()
    for w in waiters:
        w.cancel()
    await settle_writes()
    await dead.aclose()


async def test_a_promise_kept_where_it_was_made_is_kept_nowhere_else(
    redis: aioredis.Redis,
) -> None:
    clock = Clock()
    a, b, (_, rb) = two_processes(redis, clock)
    (_, wa), (_, wb) = await fill(a), await fill(b)
    shed = await shed_at(a, "kx")
    clock.t += shed.retry_after
    back = asyncio.create_task(a.acquire("interactive", "x", key="kx"))
    await asyncio.sleep(0.05)
    assert not back.done() and a.core.queues["interactive"].peek().returning
    assert not await redis.exists(promise_name("chat", "interactive", "kx"))
    again = await b.acquire("interactive", "x", key="kx")
    assert isinstance(again, Shed) and again.reason == "queue_full"
    assert count(rb, "taken") == 0
    for t in (back, wa, wb):
        t.cancel()


def test_gates_share_promises_only_where_admission_is_split(redis: aioredis.Redis) -> None:
    from filters.plugins.admission.gate import Gates
    from policy import load_policy_text

    policy = load_policy_text("""
version: 1
filters: {address: 127.0.0.1:9}
pools: {chat: {models: [m1], endpoints: [127.0.0.1:9], capacity: {max_running_requests: 4}}}
gateways: {edge: {routes: [{name: llm, pool: chat, filters: {plugins: [admission]}}]}}
""")
    clock = Clock()
    shared = SharedReturns(redis, wall=clock.wall)
    alone, split = Gates(clock=clock, wall=clock.wall), Gates(clock=clock, wall=clock.wall, local=2)
    for gates in (alone, split):
        gates.configure(policy)
        gates.share_returns(shared)
    assert alone.gate("chat").shared is None  # type: ignore[union-attr]
    assert split.gate("chat").shared is shared  # type: ignore[union-attr]
    assert shared.on_kept is not None
    split.share_returns(None)
    assert split.gate("chat").shared is None  # type: ignore[union-attr]
