from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest

from backends.emulator.request import EmuRequest, GenerationParams
from backends.emulator.scheduler import Scheduler
from backends.errors import QueueFullError, RequestError
from backends.profiles import BackendProfile, get_profile


class FakeClock:
    """Virtual time: sleeping advances it instantly."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, dt: float) -> None:
        self.now += dt
        await asyncio.sleep(0)


def _profile(**changes: object) -> BackendProfile:
    return dataclasses.replace(get_profile("seed-2k"), **changes)  # type: ignore[arg-type]


def _req(clock: FakeClock, prompt: list[int], max_new: int, rid: str = "r") -> EmuRequest:
    return EmuRequest(
        rid=rid,
        params=GenerationParams(prompt_ids=tuple(prompt), max_new_tokens=max_new, ignore_eos=True),
        rng=random.Random(1),
        arrival=clock(),
    )


async def _run_all(sched: Scheduler, reqs: list[EmuRequest]) -> None:
    sched.start()
    for r in reqs:
        sched.add(r)
    await asyncio.wait_for(asyncio.gather(*(r.wait_done() for r in reqs)), 5)


async def test_single_request_timing_follows_profile() -> None:
    clock = FakeClock()
    p = _profile()
    sched = Scheduler(p, clock=clock, sleep=clock.sleep)
    r = _req(clock, list(range(100)), 10)
    t0 = clock()
    await _run_all(sched, [r])
    assert r.first_token_at == pytest.approx(t0 + p.step_s(100, 0))
    assert r.finished_at == pytest.approx(t0 + p.step_s(100, 0) + 9 * p.itl_s(1))
    assert r.finish_reason == "length" and len(r.output_ids) == 10
    assert r.cached_tokens == 0
    await sched.aclose()
    sched.cache.check_invariants()


async def test_context_terms_make_long_prompts_slower_per_token() -> None:
    """With a profile's context terms, a prefill chunk pays for the tokens it attends to (its
    cached prefix and itself) and a decode step for the tokens each stream holds."""
    p = _profile(decode_per_kv_token_s=1e-6, prefill_per_ctx_token_s=1e-8, prefill_base_s=1e-3)
    times = {}
    for prompt in (100, 2000):
        clock = FakeClock()
        sched = Scheduler(p, clock=clock, sleep=clock.sleep)
        r = _req(clock, list(range(prompt)), 3)
        t0 = clock()
        await _run_all(sched, [r])
        first = p.step_s(prompt, 0, 0, prompt * prompt / 2)
        assert r.first_token_at == pytest.approx(t0 + first)
        # two decode steps: the stream holds the prompt and 1, then 2 output tokens
        decode = p.step_s(0, 1, prompt + 1) + p.step_s(0, 1, prompt + 2)
        assert r.finished_at == pytest.approx(t0 + first + decode)
        times[prompt] = (r.finished_at - r.first_token_at) / 2
        await sched.aclose()
    assert times[2000] > times[100] + 1.8e-3  # 1,900 more tokens read per step at 1 us each


async def test_chunked_prefill_takes_several_steps() -> None:
    clock = FakeClock()
    p = _profile(chunked_prefill_size=4096)
    sched = Scheduler(p, clock=clock, sleep=clock.sleep)
    r = _req(clock, list(range(10_000)), 1)
    t0 = clock()
    await _run_all(sched, [r])
    # three prefill steps: 4096 + 4096 + 1808 tokens
    assert r.first_token_at == pytest.approx(
        t0 + p.step_s(4096, 0) * 2 + p.step_s(10_000 - 8192, 0)
    )
    await sched.aclose()


async def test_shared_prefix_is_cached_for_the_second_request() -> None:
    clock = FakeClock()
    sched = Scheduler(_profile(), clock=clock, sleep=clock.sleep)
    a = _req(clock, list(range(200)), 5)
    await _run_all(sched, [a])
    b = _req(clock, [*range(150), 7, 7, 7], 5)
    await _run_all(sched, [b])
    assert b.cached_tokens == 150
    c = _req(clock, [*a.params.prompt_ids, *a.output_ids, 9], 5)  # next chat turn
    await _run_all(sched, [c])
    assert c.cached_tokens == 200 + 5
    assert sched.stats().cache_hit_rate == pytest.approx((150 + 205) / (200 + 153 + 206))
    await sched.aclose()
    sched.cache.check_invariants()


async def test_concurrent_requests_share_a_prefix_once_it_is_prefilled() -> None:
    clock = FakeClock()
    sched = Scheduler(_profile(), clock=clock, sleep=clock.sleep)
    first = _req(clock, list(range(300)), 50)
    sched.start()
    sched.add(first)
    while first.first_token_at is None:
        await asyncio.sleep(0)
    second = _req(clock, [*range(300), 1, 2], 5)
    await _run_all(sched, [second])
    assert second.cached_tokens == 300  # the running request's prompt is already in the tree
    await first.wait_done()
    await sched.aclose()


async def test_decode_speed_falls_and_throughput_saturates_with_batch() -> None:
    clock = FakeClock()
    p = _profile(max_running_requests=128)
    results = {}
    for n in (1, 40, 100):
        sched = Scheduler(p, clock=clock, sleep=clock.sleep)
        reqs = [_req(clock, [i, 1, 2, 3], 200, rid=str(i)) for i in range(n)]
        await _run_all(sched, reqs)
        itl = [
            (r.finished_at - r.first_token_at) / (len(r.output_ids) - 1)  # type: ignore[operator]
            for r in reqs
        ]
        results[n] = sum(itl) / len(itl)
        await sched.aclose()
    for n, itl in results.items():
        assert itl == pytest.approx(p.itl_s(n), rel=0.01)
    assert results[40] == pytest.approx(0.020, rel=0.01)


async def test_max_running_requests_bounds_the_batch() -> None:
    clock = FakeClock()
    sched = Scheduler(_profile(max_running_requests=3), clock=clock, sleep=clock.sleep)
    reqs = [_req(clock, [i, 5], 20, rid=str(i)) for i in range(8)]
    sched.start()
    for r in reqs:
        sched.add(r)
    peak = 0
    while not all(r.done for r in reqs):
        peak = max(peak, len(sched.running))
        await asyncio.sleep(0)
    assert peak == 3
    # FCFS: admission order is arrival order
    admitted = sorted(reqs, key=lambda r: r.admitted_at or 0)
    assert [r.rid for r in admitted] == [r.rid for r in reqs]
    await sched.aclose()


async def test_bounded_queue_rejects_and_oversized_request_is_a_bad_request() -> None:
    clock = FakeClock()
    sched = Scheduler(
        _profile(max_queued_requests=2, max_total_tokens=1000), clock=clock, sleep=clock.sleep
    )
    sched.add(_req(clock, [1, 2], 5))
    sched.add(_req(clock, [1, 3], 5))
    with pytest.raises(QueueFullError):
        sched.add(_req(clock, [1, 4], 5))
    with pytest.raises(RequestError):
        sched.add(_req(clock, list(range(900)), 200))
    await sched.aclose()


async def test_small_kv_pool_makes_requests_wait_and_evicts_lru() -> None:
    clock = FakeClock()
    sched = Scheduler(_profile(max_total_tokens=300), clock=clock, sleep=clock.sleep)
    a = _req(clock, [1] * 100, 50, rid="a")
    b = _req(clock, [2] * 100, 50, rid="b")
    c = _req(clock, [3] * 100, 50, rid="c")
    await _run_all(sched, [a, b, c])
    # only two fit at once (150 tokens each): c waited for a to finish
    assert c.admitted_at is not None and a.finished_at is not None
    assert c.admitted_at >= a.finished_at
    # the tree holds the most recently used sequences, within capacity
    sched.cache.check_invariants()
    assert sched.cache.total_size <= 300
    assert sched.cache.match_prefix([3] * 100).length == 100
    assert sched.cache.match_prefix([1] * 100).length == 0  # a was least recently used
    await sched.aclose()


async def test_abort_frees_everything() -> None:
    clock = FakeClock()
    sched = Scheduler(_profile(), clock=clock, sleep=clock.sleep)
    r = _req(clock, list(range(50)), 1000)
    sched.start()
    sched.add(r)
    while len(r.output_ids) < 3:
        await asyncio.sleep(0)
    sched.abort(r)
    assert r.finish_reason == "abort"
    assert sched.cache.allocated == 0 and sched.cache.protected_size == 0
    assert sched.stats().num_used_tokens == 0
    sched.cache.check_invariants()
    await sched.aclose()


async def test_idle_scheduler_does_not_step() -> None:
    clock = FakeClock()
    sched = Scheduler(_profile(), clock=clock, sleep=clock.sleep)
    sched.start()
    t0 = clock()
    for _ in range(50):
        await asyncio.sleep(0)
    assert clock() == t0  # no step ran: it waits on an event
    await sched.aclose()


async def test_idle_time_is_not_caught_up_later() -> None:
    clock = FakeClock()
    p = _profile()
    sched = Scheduler(p, clock=clock, sleep=clock.sleep)
    await _run_all(sched, [_req(clock, [1, 2, 3], 5)])
    clock.now += 0.01  # idle for less than the catch-up slack
    r = _req(clock, [4, 5, 6], 5)
    t0 = clock()
    await _run_all(sched, [r])
    assert r.finished_at == pytest.approx(t0 + p.step_s(3, 0) + 4 * p.itl_s(1))
    await sched.aclose()


async def test_paged_cache_matches_whole_pages_only() -> None:
    clock = FakeClock()
    sched = Scheduler(_profile(page_size=4, max_total_tokens=500), clock=clock, sleep=clock.sleep)
    reqs = [_req(clock, [1] * 10 + [i] * 3, 6, rid=str(i)) for i in range(2, 12)]
    for r in reqs:
        await _run_all(sched, [r])
        sched.cache.check_invariants()
    assert reqs[0].cached_tokens == 0
    assert all(r.cached_tokens == 8 for r in reqs[1:])  # 10 shared tokens -> 2 whole pages
    assert sched.cache.allocated == 0 and sched.cache.protected_size == 0
    await sched.aclose()


async def test_many_concurrent_requests_keep_accounting_exact() -> None:
    clock = FakeClock()
    sched = Scheduler(
        _profile(max_total_tokens=3000, max_running_requests=16, chunked_prefill_size=256),
        clock=clock,
        sleep=clock.sleep,
    )
    rng = random.Random(5)
    reqs = [
        _req(
            clock,
            [rng.randrange(4) for _ in range(rng.randrange(5, 300))],
            rng.randrange(1, 60),
            rid=str(i),
        )
        for i in range(60)
    ]
    sched.start()
    for r in reqs:
        sched.add(r)
    aborted = 0
    while not all(r.done for r in reqs):
        await asyncio.sleep(0)
        sched.cache.check_invariants()
        running = [r for r in reqs if not r.done and r.admitted_at is not None]
        if running and rng.random() < 0.01:
            sched.abort(running[0])
            aborted += 1
    assert aborted > 0
    assert sched.cache.allocated == 0 and sched.cache.protected_size == 0
    assert sched.stats().num_used_tokens == 0
    for r in reqs:
        if r.finish_reason == "length":
            assert len(r.output_ids) == r.params.max_new_tokens
    await sched.aclose()


def test_a_partial_last_page_stays_reserved_until_the_finish_inserts_it() -> None:
    """The tree takes whole pages: at the end of prefill a prompt's partial last page is not
    cached. Its slots were released there, so the finish's insert of prompt + output grew the tree
    past the KV pool when the pool was full (found by the state machine in
    tests/prefixindex/test_index_under_pressure.py)."""
    clock = FakeClock()
    sched = Scheduler(_profile(page_size=4, max_total_tokens=40), clock=clock, sleep=clock.sleep)
    req = _req(clock, list(range(6)), 2)  # one whole page and a 2-token tail
    assert sched._admit(req, 0.0) is not None
    req.prefilled = req.fill_len  # as the prefill steps do
    sched._uncommitted += req.fill_len - req.cached_tokens
    sched._commit_prompt(req)
    assert sched.cache.total_size == 4 and sched.cache.allocated == 2 + 1  # tail + next token
    req.output_ids.extend([7, 8])
    assert sched.cache.allocate(1)  # the second output token's slot
    req.reserved += 1
    sched._uncommitted += 2
    other = sched.cache.free
    assert sched.cache.allocate(other)  # everything else is taken: the pool is full
    req.finish_reason = "length"
    sched._release(req, commit=True)  # inserts 6 + 2 tokens: two whole pages
    sched.cache.check_invariants()
    assert sched.cache.total_size == 8 and sched.cache.allocated == other
    assert sched._uncommitted == 0


async def test_a_failing_step_aborts_requests_and_marks_unhealthy() -> None:
    clock = FakeClock()

    async def broken_sleep(dt: float) -> None:
        raise RuntimeError("boom")

    sched = Scheduler(_profile(), clock=clock, sleep=broken_sleep)
    sched.start()
    assert sched.healthy
    r = sched.add(_req(clock, [1, 2], 5))
    await asyncio.wait_for(r.wait_done(), 5)
    assert r.finish_reason == "abort"
    assert not sched.healthy
    await sched.aclose()  # does not raise again: the failure was logged
