"""The prefix index against the emulator's real radix cache (hypothesis state machine + cases).

Each replica is a ``RadixCache`` recording events; its batches go to the index in sequence,
get lost, or its process restarts. Whatever happens, the index never claims a wrong cached length:
a replica it calls known gets exactly ``match_prefix``'s answer; after a replay fills every gap
(or a restart is seen) it is known again.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from backends.emulator.radix_cache import RadixCache
from prefixindex.index import Applied, PrefixIndex
from prefixindex.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_for_index,
    encode_batch,
)

NOW = 100.0
NAMES = ("a", "b")
tokens = st.lists(st.integers(0, 3), min_size=1, max_size=14)


class Publisher:
    """One replica: a radix cache, its sequence counter and replay buffer (as the emulator's)."""

    def __init__(self, page: int) -> None:
        self.cache = RadixCache(40, page_size=page, record_events=True)
        self.seq = 0
        self.buffer: list[tuple[int, KVEventBatch]] = []

    def take(self) -> tuple[int, KVEventBatch] | None:
        events = self.cache.take_events()
        if not events:
            return None
        item = (self.seq, KVEventBatch(ts=float(self.seq), events=events))
        self.seq += 1
        self.buffer.append(item)
        return item


class IndexMachine(RuleBasedStateMachine):
    @initialize(page=st.integers(1, 3))
    def setup(self, page: int) -> None:
        self.index = PrefixIndex(page, max_blocks=10_000, stale_after_s=5.0)
        self.pubs = {n: Publisher(page) for n in NAMES}
        self.lost = dict.fromkeys(NAMES, False)  # a batch was lost since the last resync
        # the newest batch was lost and nothing came after it: no one can notice yet (the
        # subscriber's replay probe finds it within its interval)
        self.unnoticed = dict.fromkeys(NAMES, False)
        self.probes: list[list[int]] = []
        for n in NAMES:
            self.index.add_replica(n)
            self.index.heard(n, NOW)
            self._deliver(n, drop=False)

    def _deliver(self, name: str, *, drop: bool) -> None:
        item = self.pubs[name].take()
        if item is None:
            return
        self.unnoticed[name] = drop
        if drop:
            self.lost[name] = True
            return
        self.index.apply(name, *item, live=True)

    @rule(name=st.sampled_from(NAMES), seq=tokens, drop=st.booleans())
    def insert(self, name: str, seq: list[int], drop: bool) -> None:
        cache = self.pubs[name].cache
        if cache.available >= len(seq):
            cache.allocate(len(seq))
            cache.release(len(seq))
            cache.insert(seq)
        self.probes.append(seq)
        self._deliver(name, drop=drop and len(self.probes) % 3 == 0)

    @rule(name=st.sampled_from(NAMES), n=st.integers(1, 12), drop=st.booleans())
    def evict(self, name: str, n: int, drop: bool) -> None:
        self.pubs[name].cache.evict(n)
        self._deliver(name, drop=drop)

    @rule(name=st.sampled_from(NAMES), seq=tokens)
    def match(self, name: str, seq: list[int]) -> None:
        self.pubs[name].cache.match_prefix(seq)  # splits nodes: no events
        assert self.pubs[name].cache.take_events() == []

    @rule(name=st.sampled_from(NAMES))
    def flush(self, name: str) -> None:
        self.pubs[name].cache.reset()
        self._deliver(name, drop=False)
        self.lost[name] = False  # a delivered AllBlocksCleared is a baseline

    @rule(name=st.sampled_from(NAMES), drop_first=st.booleans())
    def restart(self, name: str, drop_first: bool) -> None:
        """The process starts again: seq from 0, empty cache; the subscriber sees the disconnect."""
        self.pubs[name] = Publisher(self.index.page_size)
        self.index.forget(name, "disconnected")
        self.lost[name] = drop_first
        self.unnoticed[name] = False
        self._deliver(name, drop=drop_first)

    @rule(name=st.sampled_from(NAMES))
    def resync(self, name: str) -> None:
        start = self.index.resync_from(name)
        for seq, batch in self.pubs[name].buffer:
            if seq >= start:
                assert self.index.apply(name, seq, batch, live=False) is not Applied.NEEDS_RESYNC
        self.index.heard(name, NOW)
        self.lost[name] = self.unnoticed[name] = False

    @precondition(lambda self: hasattr(self, "index"))
    @invariant()
    def never_wrong_and_known_when_nothing_lost(self) -> None:
        for name in NAMES:
            cache = self.pubs[name].cache
            known = self.index.known(name, NOW)
            if not self.lost[name]:
                assert known, self.index.view(name, NOW)
            if self.unnoticed[name]:
                continue
            for probe in [*self.probes[-6:], *cache.sequences()]:
                answer = self.index.query(probe, NOW)[name]
                if known:
                    assert answer == cache.match_prefix(probe).length, (name, probe)
                else:
                    assert answer is None


TestIndexAgainstRadixCache = IndexMachine.TestCase
TestIndexAgainstRadixCache.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None
)


def _batch(*events: object) -> KVEventBatch:
    return KVEventBatch(ts=0.0, events=list(events))  # type: ignore[arg-type]


def _index() -> PrefixIndex:
    index = PrefixIndex(1, stale_after_s=10.0)
    index.add_replica("r")
    index.heard("r", 0.0)
    index.apply("r", 0, _batch(AllBlocksCleared()))
    return index


def test_a_gap_makes_unknown_until_the_replay_fills_it() -> None:
    index = _index()
    (h1,) = [-1]  # any hash works: the index only compares them
    assert index.apply("r", 1, _batch(BlockStored([h1], None, [5], 1, None))) is Applied.APPLIED
    assert index.query_blocks([h1, 9], 1.0) == {"r": 1}
    assert index.apply("r", 3, _batch(BlockRemoved([h1]))) is Applied.NEEDS_RESYNC
    assert index.query_blocks([h1], 1.0) == {"r": None}
    assert index.resync_from("r") == 2
    index.apply("r", 2, _batch(BlockStored([7], h1, [6], 1, None)), live=False)
    assert index.query_blocks([h1], 1.0) == {"r": None}  # seq 3 is still missing
    index.apply("r", 3, _batch(BlockRemoved([h1])), live=False)
    assert index.query_blocks([h1], 1.0) == {"r": 0}
    assert index.view("r", 1.0).gaps == 1


def test_seq_going_back_on_the_live_stream_is_a_restart() -> None:
    index = _index()
    index.apply("r", 1, _batch(BlockStored([11], None, [5], 1, None)))
    assert index.apply("r", 1, _batch(BlockStored([12], None, [6], 1, None))) is (
        Applied.NEEDS_RESYNC
    )
    assert index.query_blocks([11], 1.0) == {"r": None}
    assert index.view("r", 1.0).restarts == 1 and len(index) == 0
    index.apply("r", 0, _batch(AllBlocksCleared()), live=False)
    index.apply("r", 1, _batch(BlockStored([12], None, [6], 1, None)), live=False)
    assert index.query_blocks([12], 1.0) == {"r": 1}
    assert index.query_blocks([11], 1.0) == {"r": 0}


def test_a_silent_replica_becomes_unknown() -> None:
    index = _index()
    assert index.query_blocks([1], 10.0) == {"r": 0}
    assert index.query_blocks([1], 10.5) == {"r": None}
    assert "stale" in index.view("r", 10.5).reason


def test_the_memory_bound_only_lowers_answers() -> None:
    index = PrefixIndex(1, max_blocks=3)
    for name in ("r", "s"):
        index.add_replica(name)
        index.heard(name, 0.0)
        index.apply(name, 0, _batch(AllBlocksCleared()))
    index.apply("r", 1, _batch(BlockStored([1, 2, 3], None, [1, 2, 3], 1, None)))
    index.apply("s", 1, _batch(BlockStored([1, 4], None, [1, 9], 1, None)))
    assert index.query_blocks([1, 2, 3], 0.0) == {"r": 3, "s": 1}
    assert len(index) == 5 and index.evicted_blocks == 0  # the bound is per replica
    index.apply("r", 2, _batch(BlockStored([5, 6], 3, [4, 5], 1, None)))  # r: 5 > 3 blocks
    assert index.evicted_blocks == 2 and index.view("r", 0.0).blocks == 3
    answer = index.query_blocks([1, 2, 3, 5, 6], 0.0)
    assert answer["r"] is not None and answer["r"] < 5  # lower, never higher
    assert answer["s"] == 1  # another replica's blocks are untouched


def test_removing_a_replica_frees_its_slot_and_blocks() -> None:
    index = _index()
    index.apply("r", 1, _batch(BlockStored([1], None, [1], 1, None)))
    index.remove_replica("r")
    assert len(index) == 0 and index.replicas() == []
    index.add_replica("t")
    assert index.query_blocks([1], 0.0) == {"t": None}


def test_a_live_batch_a_replay_already_applied_is_a_duplicate_not_a_restart() -> None:
    """The subscriber's probe replays up to the newest batch while the same batches still sit
    in the SUB socket; when they arrive live they are duplicates. Taking them for a restart made
    the index forget the replica about once a second under load (cold picks, full re-replays)."""
    index = _index()  # seq 0 (the baseline) came live
    index.apply("r", 1, _batch(BlockStored([1], None, [5], 1, None)), live=False)
    index.apply("r", 2, _batch(BlockStored([2], 1, [6], 1, None)), live=False)
    assert index.apply("r", 1, _batch(BlockStored([1], None, [5], 1, None))) is Applied.DUPLICATE
    assert index.apply("r", 2, _batch(BlockStored([2], 1, [6], 1, None))) is Applied.DUPLICATE
    assert index.view("r", 1.0).restarts == 0
    assert index.query_blocks([1, 2], 1.0) == {"r": 2}
    assert index.apply("r", 3, _batch(BlockRemoved([2]))) is Applied.APPLIED
    assert index.query_blocks([1, 2], 1.0) == {"r": 1}
    # the live stream itself going back is still a restart
    assert index.apply("r", 0, _batch(AllBlocksCleared())) is Applied.APPLIED
    assert index.view("r", 1.0).restarts == 1 and index.query_blocks([1], 1.0) == {"r": 0}


def test_with_anchors_only_anchor_blocks_are_kept_and_answers_round_down_to_them() -> None:
    index = PrefixIndex(2, anchor_every=4)
    index.add_replica("r")
    index.heard("r", 0.0)
    index.apply("r", 0, _batch(AllBlocksCleared()))
    # block hashes as pages 0..7 of one prompt: pages 1, 4 and 6 are anchors (low 2 bits zero)
    pages = [5, 8, 7, 3, 12, 9, 16, 1]
    index.apply("r", 1, _batch(BlockStored(pages[:5], None, list(range(10)), 2, None)))
    assert index.blocks_of("r") == 2  # 8 and 12 only
    # the replica holds pages 0-4 (10 tokens): the last anchor in them is page 4, all 10 tokens
    assert index.query_blocks(pages, 0.0) == {"r": 10}
    assert index.anchored(pages, 10) == 10
    # a cached prefix of pages 0-3 (8 tokens) is answered up to its last anchor, page 1
    index.apply("r", 2, _batch(BlockRemoved([12])))
    assert index.query_blocks(pages, 0.0) == {"r": 4}
    assert index.anchored(pages, 9) == 4  # the partial page and pages 2-3 are not counted
    index.apply("r", 3, _batch(BlockRemoved([5, 8])))
    assert index.query_blocks(pages, 0.0) == {"r": 0} and len(index) == 0


def test_a_batch_decoded_for_other_anchors_is_refused() -> None:
    raw = encode_batch(_batch(AllBlocksCleared(), BlockStored([16, 3], None, [1, 2], 1, None)))
    index = PrefixIndex(1, anchor_every=16)
    index.add_replica("r")
    assert index.apply("r", 0, decode_for_index(raw, 16)) is Applied.APPLIED
    assert index.blocks_of("r") == 1
    with pytest.raises(ValueError, match="anchor_every"):
        index.apply("r", 1, decode_for_index(raw, 1))
    with pytest.raises(ValueError, match="power of two"):
        PrefixIndex(1, anchor_every=12)
