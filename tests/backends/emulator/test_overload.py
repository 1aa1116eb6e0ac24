"""The emulator under overload, against SGLang's scheduler semantics (fake clock, no network):
a bounded waiting queue, optimistic KV admission with ``new_token_ratio``, retraction."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from dataclasses import dataclass

import pytest

from backends.emulator.kv_budget import (
    CLIP_MAX_NEW_TOKENS,
    NewTokenRatio,
    admits,
    decode_room,
    retraction_order,
    running_expectation,
)
from backends.emulator.request import EmuRequest, GenerationParams
from backends.emulator.scheduler import Scheduler
from backends.errors import QueueFullError
from backends.profiles import BackendProfile, get_profile
from tests.backends.emulator.test_scheduler import FakeClock


def _profile(**changes: object) -> BackendProfile:
    base = dict(chunked_prefill_size=8192, page_size=1)
    return dataclasses.replace(get_profile("seed-2k"), **{**base, **changes})  # type: ignore[arg-type]


def _req(clock: FakeClock, prompt: list[int], max_new: int, rid: str) -> EmuRequest:
    return EmuRequest(
        rid=rid,
        params=GenerationParams(tuple(prompt), max_new, ignore_eos=True),
        rng=random.Random(1),
        arrival=clock(),
    )


@dataclass
class R:
    prompt_len: int
    max_new_tokens: int
    output_len: int


# ---- the pure budget -------------------------------------------------------------------------
def test_new_token_ratio_decays_to_its_floor_and_resets() -> None:
    r = NewTokenRatio()
    assert r.value == 0.7
    for _ in range(700):
        r.decay()
    assert r.value == pytest.approx(0.7 * 0.14)
    r.reset()
    assert r.value == 0.7


def test_after_a_retraction_the_ratio_covers_what_the_rest_decoded_plus_twenty_steps() -> None:
    r = NewTokenRatio(0.1)
    r.after_retract([R(10, 100, 30), R(10, 100, 50)])
    assert r.value == pytest.approx((80 + 2 * 20) / 200)
    r.after_retract([R(10, 10, 9)])
    assert r.value == 1.0


def test_admission_counts_a_share_of_what_running_requests_may_still_produce() -> None:
    running = [R(100, 600, 0), R(100, 5000, 100)]
    reserved = running_expectation(running, 0.5)
    assert reserved == pytest.approx(0.5 * 600 + 0.5 * CLIP_MAX_NEW_TOKENS)
    assert admits(100, 300, available=3000, reserved=reserved)
    assert not admits(100, 300, available=2700, reserved=reserved)  # SGLang: strictly less


def test_retraction_takes_the_fewest_output_tokens_then_the_longest_prompt() -> None:
    reqs = [R(10, 100, 50), R(500, 100, 3), R(20, 100, 3), R(10, 100, 90)]
    order = retraction_order(reqs)
    assert [order.pop(), order.pop(), order.pop()] == [1, 2, 0]
    assert decode_room(40, 2) and not decode_room(39, 2)


# ---- the scheduler ---------------------------------------------------------------------------
async def test_the_queue_grows_under_load_and_rejects_past_its_bound_with_sglangs_words() -> None:
    clock = FakeClock()
    sched = Scheduler(
        _profile(max_running_requests=2, max_queued_requests=3), clock=clock, sleep=clock.sleep
    )
    reqs = [_req(clock, [i, 1, 2], 1000, str(i)) for i in range(3)]
    for r in reqs:
        sched.add(r)
    sched.start()
    while len(sched.running) < 2:
        await asyncio.sleep(0)
    assert (sched.stats().num_running_reqs, sched.stats().num_queue_reqs) == (2, 1)
    sched.add(_req(clock, [7, 1], 1000, "3"))
    sched.add(_req(clock, [8, 1], 1000, "4"))
    assert sched.stats().num_queue_reqs == 3
    with pytest.raises(QueueFullError, match=r"^The request queue is full\.$"):
        sched.add(_req(clock, [9, 1], 1000, "5"))
    await sched.aclose()


async def test_admission_is_optimistic_as_sglangs_new_token_ratio() -> None:
    # 610 + 410 tokens exceed the 1000-token pool if both ran to the end, yet SGLang admits
    # the second: it expects the first to need only 0.7 of its remaining output
    clock = FakeClock()
    sched = Scheduler(_profile(max_total_tokens=1000), clock=clock, sleep=clock.sleep)
    a = _req(clock, [1] * 10, 600, "a")
    sched.start()
    sched.add(a)
    while not a.output_ids:
        await asyncio.sleep(0)
    b = _req(clock, [2] * 10, 400, "b")
    sched.add(b)
    while b.admitted_at is None and not a.done:
        await asyncio.sleep(0)
    assert b.admitted_at is not None and not a.done
    await sched.aclose()


async def test_kv_exhaustion_retracts_the_newest_decoder_which_resumes_and_completes() -> None:
    # 20 requests of 10 + 100 tokens on a 1000-token pool: the optimistic budget admits more than
    # fit to the end, so decode runs out of KV and SGLang retracts
    clock = FakeClock()
    sched = Scheduler(_profile(max_total_tokens=1000), clock=clock, sleep=clock.sleep)
    reqs = [_req(clock, [i + 3] * 10, 100, str(i)) for i in range(20)]
    sched.start()
    for r in reqs:
        sched.add(r)
    outputs_at_retraction: dict[str, int] = {}
    while not all(r.done for r in reqs):
        await asyncio.sleep(0)
        sched.cache.check_invariants()
        for r in sched.waiting:
            if r.recomputed and r.rid not in outputs_at_retraction:
                outputs_at_retraction[r.rid] = r.recomputed
                assert all(o.output_len >= r.recomputed for o in sched.running)  # fewest first
    assert sched.retracted_total >= 1 and outputs_at_retraction
    assert all(n > 0 for n in outputs_at_retraction.values())  # they had streamed tokens
    for r in reqs:  # every one completes, the retracted ones after prefilling prompt + output
        assert (r.finish_reason, len(r.output_ids)) == ("length", 100)
    assert sched.new_token_ratio.value > 0.7 * 0.14
    assert sched.cache.allocated == 0 and sched.cache.protected_size == 0
    assert sched.stats().num_used_tokens == 0
    await sched.aclose()


async def test_random_overload_keeps_kv_accounting_exact_through_retractions_and_aborts() -> None:
    clock = FakeClock()
    sched = Scheduler(
        _profile(max_total_tokens=2000, max_running_requests=32, chunked_prefill_size=256),
        clock=clock,
        sleep=clock.sleep,
    )
    rng = random.Random(11)
    reqs = [
        _req(
            clock,
            [rng.randrange(3) for _ in range(rng.randrange(5, 200))],
            rng.randrange(50, 400),
            str(i),
        )
        for i in range(40)
    ]
    sched.start()
    for r in reqs:
        sched.add(r)
    while not all(r.done for r in reqs):
        await asyncio.sleep(0)
        sched.cache.check_invariants()
        if rng.random() < 0.002:
            live = [r for r in reqs if not r.done]
            sched.abort(live[rng.randrange(len(live))])
    assert sched.retracted_total > 0
    for r in reqs:
        if r.finish_reason == "length":
            assert len(r.output_ids) == r.params.max_new_tokens
    assert sched.cache.allocated == 0 and sched.cache.protected_size == 0
    assert sched.stats().num_used_tokens == 0
    await sched.aclose()
