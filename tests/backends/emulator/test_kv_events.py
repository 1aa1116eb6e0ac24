"""The emulator's radix cache records SGLang's KV events as its tree changes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from backends.emulator.radix_cache import RadixCache
from prefixindex.hashing import prefix_block_ids
from prefixindex.wire import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent


def _tree_blocks(cache: RadixCache) -> set[int]:
    """Every page's block hash in the tree, computed from the token sequences alone."""
    out: set[int] = set()
    for seq in cache.sequences():
        out.update(prefix_block_ids(seq, cache.page_size))
    return out


def _replay(events: list[KvEvent], held: set[int]) -> None:
    for ev in events:
        if isinstance(ev, AllBlocksCleared):
            held.clear()
        elif isinstance(ev, BlockStored):
            assert ev.block_hashes and len(ev.token_ids) == len(ev.block_hashes) * ev.block_size
            assert ev.parent_block_hash is None or ev.parent_block_hash in held
            assert not held & set(ev.block_hashes), "a block stored twice"
            held.update(ev.block_hashes)
        else:
            assert set(ev.block_hashes) <= held, "removal of a block never stored"
            held.difference_update(ev.block_hashes)


def test_a_fresh_cache_starts_with_all_cleared_and_off_records_nothing() -> None:
    assert RadixCache(100, record_events=True).take_events() == [AllBlocksCleared()]
    off = RadixCache(100)
    off.insert([1, 2, 3])
    off.evict(10)
    assert off.take_events() == []


def test_insert_split_evict_reset() -> None:
    cache = RadixCache(100, page_size=2, record_events=True)
    cache.take_events()
    cache.insert([1, 2, 3, 4, 5])  # 2 whole pages
    (stored,) = cache.take_events()
    assert stored == BlockStored(
        prefix_block_ids([1, 2, 3, 4], 2), None, [1, 2, 3, 4], 2, None, "GPU"
    )
    cache.match_prefix([1, 2, 9, 9])  # splits the node: no event
    assert cache.take_events() == []
    cache.insert([1, 2, 7, 8])
    (branch,) = cache.take_events()
    assert isinstance(branch, BlockStored)
    assert branch.parent_block_hash == prefix_block_ids([1, 2], 2)[0]
    assert branch.block_hashes == prefix_block_ids([1, 2, 7, 8], 2)[1:]
    cache.evict(2)
    (removed,) = cache.take_events()
    assert isinstance(removed, BlockRemoved) and len(removed.block_hashes) == 1
    cache.reset()
    assert cache.take_events() == [AllBlocksCleared()]


ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.lists(st.integers(0, 3), min_size=1, max_size=12)),
        st.tuples(st.just("match"), st.lists(st.integers(0, 3), min_size=1, max_size=12)),
        st.tuples(st.just("evict"), st.integers(1, 10)),
        st.tuples(st.just("reset"), st.none()),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(1, 3))
def test_events_replayed_give_exactly_the_trees_blocks(
    sequence: list[tuple[str, object]], page: int
) -> None:
    cache = RadixCache(60, page_size=page, record_events=True)
    held: set[int] = set()
    for op, arg in sequence:
        if op == "insert":
            assert isinstance(arg, list)
            if cache.available >= len(arg):
                cache.allocate(len(arg))
                cache.release(len(arg))
                cache.insert(arg)
        elif op == "match":
            assert isinstance(arg, list)
            cache.match_prefix(arg)
        elif op == "evict":
            assert isinstance(arg, int)
            cache.evict(arg)
        else:
            cache.reset()
        _replay(cache.take_events(), held)
        assert held == _tree_blocks(cache)


async def test_the_scheduler_publishes_one_batch_per_step_and_on_flush() -> None:
    import asyncio
    import dataclasses
    import random

    from backends.emulator.request import EmuRequest, GenerationParams
    from backends.emulator.scheduler import Scheduler
    from backends.profiles import get_profile

    now = [1000.0]

    async def sleep(dt: float) -> None:
        now[0] += dt
        await asyncio.sleep(0)

    batches: list[list[KvEvent]] = []
    profile = dataclasses.replace(get_profile("seed-2k"), max_total_tokens=5000)
    sched = Scheduler(profile, clock=lambda: now[0], sleep=sleep, kv_sink=batches.append)
    sched.start()
    assert batches == [[AllBlocksCleared()]]
    prompt = tuple(range(100, 140))
    req = EmuRequest(
        rid="r",
        params=GenerationParams(prompt_ids=prompt, max_new_tokens=3, ignore_eos=True),
        rng=random.Random(1),
        arrival=now[0],
    )
    sched.add(req)
    await asyncio.wait_for(req.wait_done(), 5)
    held: set[int] = set()
    for batch in batches:
        assert batch, "an empty batch was published"
        _replay(batch, held)
    assert held == _tree_blocks(sched.cache)
    assert set(prefix_block_ids(list(prompt), 1)) <= held
    assert sched.flush_cache()
    assert batches[-1] == [AllBlocksCleared()]
    await sched.aclose()


def test_the_flag_is_parsed_and_a_bad_one_is_refused(capsys: object) -> None:
    import pytest

    from backends.emulator.__main__ import parse_args

    settings_ = parse_args(["--kv-events-config", '{"publisher": "zmq", "topic": "t"}'])
    assert settings_.kv_events is not None and settings_.kv_events.topic == "t"
    assert parse_args([]).kv_events is None
    with pytest.raises(SystemExit):
        parse_args(["--kv-events-config", '{"publisher": "kafka"}'])
