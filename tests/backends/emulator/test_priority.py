"""SGLang's priority scheduling in the emulator: the pure policy, then the scheduler (fake clock)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import sys
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.emulator.priority import (
    ABORTED_BY_PRIORITY,
    PRIORITY_DISABLED,
    PriorityConfig,
    preemption_victims,
    queue_eviction,
)
from backends.emulator.request import EmuRequest, GenerationParams
from backends.emulator.scheduler import Scheduler
from backends.errors import QueueFullError, SchedulerAbortError
from backends.profiles import BackendProfile, get_profile
from tests.backends.emulator.test_scheduler import FakeClock

ON = PriorityConfig(enabled=True)


@dataclass
class P:
    priority: int
    queue_seq: int
    max_new_tokens: int = 100
    output_len: int = 0


# ---- the pure policy -------------------------------------------------------------------------
def test_a_missing_priority_is_the_worst_and_off_ignores_priorities() -> None:
    assert ON.resolve(None) == -sys.maxsize - 1
    assert PriorityConfig(enabled=True, low_values_first=True).resolve(None) == sys.maxsize
    assert ON.resolve(7) == 7
    assert PriorityConfig().resolve(7) is None  # off: ignored, as SGLang by default
    with pytest.raises(ValueError, match=PRIORITY_DISABLED):
        PriorityConfig(abort_when_disabled=True).resolve(7)
    assert PriorityConfig(abort_when_disabled=True).resolve(None) is None


def test_the_queue_is_ordered_by_priority_then_by_entry() -> None:
    a, b, c, d = P(1, 1), P(5, 2), P(1, 3), P(5, 4)
    assert ON.queue_order([a, b, c, d]) == [b, d, a, c]
    low_first = PriorityConfig(enabled=True, low_values_first=True)
    assert low_first.queue_order([a, b, c, d]) == [a, c, b, d]


def test_victims_are_the_least_urgent_then_newest_until_the_newcomer_fits() -> None:
    old_low, new_low, mid = P(0, 1), P(0, 2), P(15, 3)
    running = [old_low, mid, new_low]
    # the newcomer lacks 50 + 100 - 100 = 50 tokens; each victim is expected to free 70
    assert preemption_victims(ON, P(20, 9), 50, running, 100, 0.7) == [new_low]
    assert preemption_victims(ON, P(20, 9), 130, running, 100, 0.7) == [new_low, old_low]
    # lacking 150 needs a third, but 15 is within the threshold (10) of 20: none at all
    assert preemption_victims(ON, P(20, 9), 150, running, 100, 0.7) == []
    assert preemption_victims(ON, P(30, 9), 150, running, 100, 0.7) == [new_low, old_low, mid]


def test_the_priority_gap_must_exceed_the_threshold() -> None:
    running = [P(0, 1)]
    assert preemption_victims(ON, P(10, 2), 1, running, 10, 1.0) == []  # gap 10, not > 10
    assert preemption_victims(ON, P(11, 2), 1, running, 10, 1.0) == running
    zero = PriorityConfig(enabled=True, preemption_threshold=0)
    assert preemption_victims(zero, P(1, 2), 1, running, 10, 1.0) == running
    low_first = PriorityConfig(enabled=True, low_values_first=True)
    assert preemption_victims(low_first, P(-11, 2), 1, running, 10, 1.0) == running
    assert preemption_victims(low_first, P(11, 2), 1, running, 10, 1.0) == []


def test_a_full_queue_evicts_its_least_urgent_newest_only_for_a_more_urgent_newcomer() -> None:
    a, b, c = P(3, 1), P(1, 2), P(1, 3)
    assert queue_eviction(ON, P(2, 9), [a, b, c]) is c
    assert queue_eviction(ON, P(1, 9), [a, b, c]) is None  # equal: the newcomer is refused
    assert queue_eviction(PriorityConfig(), P(9, 9), [a, b, c]) is None


# ---- the scheduler ---------------------------------------------------------------------------
def _profile(**changes: object) -> BackendProfile:
    base = dict(chunked_prefill_size=8192, page_size=1)
    return dataclasses.replace(get_profile("seed-2k"), **{**base, **changes})  # type: ignore[arg-type]


def _req(clock: FakeClock, rid: str, max_new: int, priority: int | None) -> EmuRequest:
    prompt = tuple([hash(rid) % 7 + 3] * 20)
    params = GenerationParams(prompt, max_new, ignore_eos=True, priority=priority)
    return EmuRequest(rid=rid, params=params, rng=random.Random(1), arrival=clock())


async def _until(cond: object, sched: Scheduler) -> None:
    for _ in range(100_000):
        sched.cache.check_invariants()
        if cond():  # type: ignore[operator]
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


def _drained(sched: Scheduler) -> bool:
    return (
        sched.cache.allocated == 0
        and sched.cache.protected_size == 0
        and sched.stats().num_used_tokens == 0
    )


async def test_an_urgent_request_preempts_a_running_one_which_resumes_to_its_full_output() -> None:
    clock = FakeClock()
    sched = Scheduler(_profile(max_running_requests=2), clock=clock, sleep=clock.sleep, priority=ON)
    sched.start()
    low = [sched.add(_req(clock, f"low{i}", 200, 0)) for i in range(2)]
    await _until(lambda: all(len(r.output_ids) >= 5 for r in low), sched)
    high = sched.add(_req(clock, "high", 10, 20))
    await _until(lambda: high.first_token_at is not None, sched)
    assert not any(r.done for r in low)
    assert sched.preempted_total == 1 and sched.retracted_total == 0
    await asyncio.wait_for(asyncio.gather(*(r.wait_done() for r in [*low, high])), 5)
    for r in low:  # the preempted one kept its output and recomputed it: nothing lost
        assert (r.finish_reason, len(r.output_ids)) == ("length", 200)
    assert high.finished_at is not None and high.finished_at < min(r.finished_at or 0 for r in low)
    assert _drained(sched)
    await sched.aclose()


@pytest.mark.parametrize(
    "priority",
    [PriorityConfig(enabled=True, preemption_threshold=30), PriorityConfig()],
    ids=["within-threshold", "off"],
)
async def test_no_preemption_within_the_threshold_or_with_priority_off(
    priority: PriorityConfig,
) -> None:
    clock = FakeClock()
    sched = Scheduler(
        _profile(max_running_requests=2), clock=clock, sleep=clock.sleep, priority=priority
    )
    sched.start()
    low = [sched.add(_req(clock, f"low{i}", 50, 0)) for i in range(2)]
    await _until(lambda: all(r.output_ids for r in low), sched)
    high = sched.add(_req(clock, "high", 10, 20))
    await asyncio.wait_for(asyncio.gather(*(r.wait_done() for r in [*low, high])), 5)
    assert high.first_token_at is not None
    assert high.first_token_at >= min(r.finished_at or 0 for r in low)  # it waited for a slot
    assert sched.preempted_total == 0
    await sched.aclose()


async def test_the_waiting_queue_admits_the_most_urgent_first() -> None:
    clock = FakeClock()
    sched = Scheduler(_profile(max_running_requests=1), clock=clock, sleep=clock.sleep, priority=ON)
    sched.start()
    first = sched.add(_req(clock, "first", 5, 100))  # runs at once; no one may preempt it
    rest = [sched.add(_req(clock, f"p{p}", 5, p)) for p in (1, 3, 2, None)]
    await asyncio.wait_for(asyncio.gather(*(r.wait_done() for r in [first, *rest])), 5)
    order = sorted(rest, key=lambda r: r.first_token_at or 0)
    assert [r.rid for r in order] == ["p3", "p2", "p1", "pNone"]
    await sched.aclose()


async def test_a_full_queue_aborts_its_least_urgent_request_for_a_more_urgent_one() -> None:
    clock = FakeClock()
    sched = Scheduler(
        _profile(max_running_requests=1, max_queued_requests=2),
        clock=clock,
        sleep=clock.sleep,
        priority=ON,
    )
    running = sched.add(_req(clock, "running", 50, 100))
    sched.start()
    await _until(lambda: running.output_ids, sched)
    old, new = sched.add(_req(clock, "old", 5, 1)), sched.add(_req(clock, "new", 5, 1))
    with pytest.raises(QueueFullError, match=r"^The request queue is full\.$"):
        sched.add(_req(clock, "equal", 5, 1))
    urgent = sched.add(_req(clock, "urgent", 5, 2))
    assert (new.finish_reason, new.abort_message) == ("abort", ABORTED_BY_PRIORITY)
    assert not old.done and urgent in sched.waiting
    await asyncio.wait_for(asyncio.gather(*(r.wait_done() for r in [running, old, urgent])), 5)
    assert _drained(sched)
    await sched.aclose()


async def test_a_priority_is_refused_when_off_and_so_configured() -> None:
    clock = FakeClock()
    sched = Scheduler(
        _profile(),
        clock=clock,
        sleep=clock.sleep,
        priority=PriorityConfig(abort_when_disabled=True),
    )
    with pytest.raises(SchedulerAbortError, match=PRIORITY_DISABLED):
        sched.add(_req(clock, "r", 5, 1))
    sched.add(_req(clock, "plain", 5, None))  # no priority: served
    await sched.aclose()


@settings(max_examples=40, deadline=None)
@given(
    reqs=st.lists(
        st.tuples(
            st.integers(1, 40),  # prompt length
            st.integers(1, 250),  # max_new_tokens
            st.one_of(st.none(), st.integers(-3, 40)),  # priority
            st.integers(0, 30),  # steps to let pass before it arrives
        ),
        min_size=2,
        max_size=25,
    ),
    kv=st.sampled_from([300, 600, 1200]),
    batch=st.sampled_from([2, 4]),
    threshold=st.integers(0, 15),
    low_first=st.booleans(),
    abort_every=st.integers(0, 40),
    seed=st.integers(0, 2**16),
)
def test_random_preemption_keeps_kv_accounting_exact_and_outputs_whole(
    reqs: list[tuple[int, int, int | None, int]],
    kv: int,
    batch: int,
    threshold: int,
    low_first: bool,
    abort_every: int,
    seed: int,
) -> None:
    cfg = PriorityConfig(enabled=True, low_values_first=low_first, preemption_threshold=threshold)
    profile = _profile(max_total_tokens=kv, max_running_requests=batch, chunked_prefill_size=64)
    asyncio.run(_drive(reqs, profile, cfg, abort_every, random.Random(seed)))


async def _drive(
    specs: list[tuple[int, int, int | None, int]],
    profile: BackendProfile,
    cfg: PriorityConfig,
    abort_every: int,
    rng: random.Random,
) -> None:
    clock = FakeClock()
    sched = Scheduler(profile, clock=clock, sleep=clock.sleep, priority=cfg)
    sched.start()
    reqs: list[EmuRequest] = []
    seen: dict[str, int] = {}
    for i, (plen, max_new, prio, wait) in enumerate(specs):
        for _ in range(wait):
            await asyncio.sleep(0)
        prompt = tuple(rng.randrange(3) for _ in range(plen))
        params = GenerationParams(prompt, max_new, ignore_eos=True, priority=prio)
        r = EmuRequest(rid=str(i), params=params, rng=random.Random(i), arrival=clock())
        reqs.append(sched.add(r))
    step = 0
    while not all(r.done for r in reqs):
        await asyncio.sleep(0)
        step += 1
        sched.cache.check_invariants()
        assert len(sched.running) <= profile.max_running_requests
        for r in reqs:  # output is never taken back, preempted or not
            assert len(r.output_ids) >= seen.get(r.rid, 0)
            seen[r.rid] = len(r.output_ids)
        if abort_every and step % abort_every == 0:
            live = [r for r in reqs if not r.done]
            if live:
                sched.abort(live[rng.randrange(len(live))])
    for r in reqs:
        if r.finish_reason == "length":
            assert len(r.output_ids) == r.params.max_new_tokens
    assert _drained(sched)
    await sched.aclose()
