"""`up`'s supervisor on fake parts (no processes): every dead part is started again after a
backoff that doubles, is capped and jittered; a part that ran fine starts its count again; a
failed start is retried, never given up; deaths and restarts are counted on /metrics."""

from __future__ import annotations

import asyncio
import random

from prometheus_client import CollectorRegistry, generate_latest

from tokenweir.restarter import Backoff, Part, Supervisor


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakePart:
    """Dies when told; its restarts fail ``fail_next`` times, then succeed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.running = True
        self.status: int | None = None
        self.fail_next = 0
        self.starts = 0
        self.sup: Supervisor | None = None
        self.tries_seen: list[int] = []  # restarts() as each start began

    def kill(self, status: int = -9) -> None:
        self.running, self.status = False, status

    async def restart(self) -> str:
        self.starts += 1
        self.tries_seen.append(self.sup.restarts(self.name) if self.sup else -1)
        if self.fail_next:
            self.fail_next -= 1
            raise OSError("port in use")
        self.running, self.status = True, None
        return f"pid {1000 + self.starts}"

    def part(self) -> Part:
        return Part(
            self.name,
            lambda: self.running,
            lambda: self.status,
            lambda: "line 1\nboom: out of memory",
            self.restart,
        )


async def until(check: object, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not check():  # type: ignore[operator]
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.005)


def supervisor(clock: FakeClock, said: list[str], **backoff: float) -> Supervisor:
    b = Backoff(**{"base": 0.01, "cap": 0.04, "jitter": 0.0, **backoff})
    return Supervisor(backoff=b, rng=random.Random(1), clock=clock, say=said.append, poll=0.002)


def test_backoff_doubles_is_capped_and_jittered_within_bounds() -> None:
    b = Backoff(base=0.25, cap=30.0, jitter=0.2)
    rng = random.Random(7)
    plain = Backoff(base=0.25, cap=30.0, jitter=0.0)
    assert [plain.delay(n, rng) for n in (1, 2, 3, 4, 8, 9, 50)] == [
        0.25, 0.5, 1.0, 2.0, 30.0, 30.0, 30.0,
    ]  # fmt: skip
    draws = [b.delay(3, rng) for _ in range(500)]
    assert 0.8 <= min(draws) < 0.85 and 1.15 < max(draws) <= 1.2  # 1.0 ± 20 %, spread out
    assert max(b.delay(40, rng) for _ in range(100)) <= 36.0


async def test_a_dead_part_is_started_again_logged_and_counted() -> None:
    clock, said = FakeClock(), []
    sup = supervisor(clock, said)
    redis = FakePart("redis")
    redis.sup = sup
    sup.watch(redis.part())
    sup.start()
    try:
        clock.now = 12.0
        redis.kill(-9)
        await until(lambda: redis.running)
        await until(lambda: sup.is_up("redis"))
        assert "redis exited with -9 after 12.0s; starting it again in 0.01s" in said[0]
        assert "first failure" in said[0] and "boom: out of memory" in said[0]
        assert said[1] == "tokenweir up: redis rejoined (pid 1001)"
        registry = CollectorRegistry()
        registry.register(sup.collector())
        page = generate_latest(registry).decode()
        assert 'tokenweir_up_child_up{child="redis"} 1.0' in page
        assert 'tokenweir_up_child_exits_total{child="redis"} 1.0' in page
        assert 'tokenweir_up_child_restarts_total{child="redis",result="ok"} 1.0' in page
        assert 'tokenweir_up_child_restarts_total{child="redis",result="failed"} 0.0' in page
        clock.now = 13.0
        redis.kill(1)  # again, at once: not run fine
        await until(lambda: redis.starts == 2 and sup.is_up("redis"))
        assert "2 failures in a row" in said[2]
        assert sup.restarts("redis") == 2
        assert redis.tries_seen == [1, 2]  # counted as each start begins: a fresh Envoy base id
    finally:
        await sup.aclose()


async def test_failed_starts_are_retried_with_growing_delays_never_given_up() -> None:
    clock, said = FakeClock(), []
    sup = supervisor(clock, said, cap=0.02)
    em = FakePart("emulator chat#1")
    sup.watch(em.part())
    sup.start()
    try:
        em.fail_next = 6  # more failures than any "N in a row" rule would allow
        em.kill(70)
        await until(lambda: em.running and sup.is_up("emulator chat#1"))
        assert em.starts == 7
        tries = [s for s in said if "did not start again" in s]
        assert len(tries) == 6 and "port in use" in tries[0]
        assert "2 failures in a row" in tries[0] and "7 failures in a row" in tries[-1]
        assert "next try in 0.02s" in tries[-1]  # capped
        registry = CollectorRegistry()
        registry.register(sup.collector())
        page = generate_latest(registry).decode()
        assert 'restarts_total{child="emulator chat#1",result="failed"} 6.0' in page
        assert 'tokenweir_up_child_failures_in_a_row{child="emulator chat#1"} 7.0' in page
    finally:
        await sup.aclose()


async def test_a_part_that_ran_fine_starts_its_count_again() -> None:
    clock, said = FakeClock(), []
    sup = supervisor(clock, said, stable_after=10.0)
    env = FakePart("envoy edge")
    sup.watch(env.part())
    sup.start()
    try:
        for n in range(3):  # three quick deaths: the count grows
            env.kill()
            await until(lambda n=n: env.starts == n + 1 and sup.is_up("envoy edge"))
        assert "3 failures in a row" in said[-2]
        clock.now += 60.0  # then it runs a minute
        env.kill()
        await until(lambda: env.starts == 4 and sup.is_up("envoy edge"))
        assert "first failure" in said[-2] and "starting it again in 0.01s" in said[-2]
    finally:
        await sup.aclose()


async def test_after_aclose_an_exit_is_a_stop_not_a_death() -> None:
    clock, said = FakeClock(), []
    sup = supervisor(clock, said)
    filters = FakePart("filters")
    sup.watch(filters.part())
    sup.start()
    await asyncio.sleep(0.01)
    await sup.aclose()
    filters.kill(0)
    await asyncio.sleep(0.05)
    assert filters.starts == 0 and said == []
