from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    rule,
)

from backends.emulator.radix_cache import CacheNode, RadixCache


def _lcp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_match_splits_and_insert_shares_prefix() -> None:
    c = RadixCache(100)
    assert c.insert([1, 2, 3, 4]).added == 4
    r = c.insert([1, 2, 9])
    assert (r.prefix_length, r.added) == (2, 1)
    assert sorted(c.sequences()) == [(1, 2, 3, 4), (1, 2, 9)]
    assert c.match_prefix([1, 2, 3, 7]).length == 3
    assert sorted(c.sequences()) == [(1, 2, 3, 4), (1, 2, 9)]
    assert c.total_size == 5
    c.check_invariants()


def test_page_size_cuts_to_whole_pages() -> None:
    c = RadixCache(100, page_size=4)
    assert c.insert(list(range(10))).added == 8
    assert c.match_prefix([0, 1, 2, 3, 4, 5, 99, 7]).length == 4
    assert c.match_prefix([0, 1, 2]).length == 0
    c.check_invariants()


def test_full_cache_evicts_least_recently_used_leaf() -> None:
    c = RadixCache(12)
    c.insert([1, 1, 1, 1])  # A
    c.insert([2, 2, 2, 2])  # B
    c.insert([3, 3, 3, 3])  # C
    c.match_prefix([1, 1, 1, 1])  # A is now more recent than B
    assert c.allocate(4)  # needs 4 tokens: evicts B, the least recently used
    seqs = sorted(c.sequences())
    assert seqs == [(1, 1, 1, 1), (3, 3, 3, 3)]
    c.check_invariants()


def test_eviction_cascades_to_parent_that_becomes_leaf() -> None:
    c = RadixCache(10)
    c.insert([5, 6, 7])
    c.insert([5, 6, 8])  # splits: [5,6] -> [7], [8]
    c.insert([9])
    c.match_prefix([9])
    assert c.evict(4) == 4  # [7], [8], then their parent [5, 6] once it is a leaf
    assert c.sequences() == [(9,)]
    c.check_invariants()


def test_locked_prefix_survives_eviction_and_allocation_fails_when_all_locked() -> None:
    c = RadixCache(8)
    c.insert([1, 2, 3, 4])
    m = c.match_prefix([1, 2, 3, 4, 5])
    c.lock(m.node)
    assert c.protected_size == 4 and c.evictable_size == 0
    assert not c.allocate(5)
    assert c.allocate(4)
    assert c.match_prefix([1, 2, 3, 4]).length == 4
    c.release(4)
    c.unlock(m.node)
    assert c.evictable_size == 4
    assert c.allocate(8)
    assert c.total_size == 0
    c.check_invariants()


def test_lock_on_split_node_still_covers_whole_path() -> None:
    c = RadixCache(100)
    c.insert([1, 2, 3, 4])
    m = c.match_prefix([1, 2, 3, 4])
    c.lock(m.node)
    c.match_prefix([1, 2, 7])  # splits the locked node
    c.check_invariants()
    assert c.protected_size == 4
    c.unlock(m.node)
    assert c.protected_size == 0
    c.check_invariants()


def test_unlock_without_lock_raises_and_reset_flushes() -> None:
    c = RadixCache(10)
    r = c.insert([1, 2])
    with pytest.raises(RuntimeError):
        c.unlock(r.node)
    c.reset()
    assert c.total_size == 0 and c.sequences() == []


SEQ = st.lists(st.integers(0, 3), min_size=0, max_size=12)


class RadixMachine(RuleBasedStateMachine):
    """Random inserts, matches, locks, evictions and allocations keep the invariants."""

    locks = Bundle("locks")
    page_size = 1

    def __init__(self) -> None:
        super().__init__()
        self.cache = RadixCache(capacity_tokens=40, page_size=self.page_size)
        self.held: list[tuple[CacheNode, tuple[int, ...]]] = []
        self.allocs: list[int] = []

    @rule(seq=SEQ)
    def insert(self, seq: list[int]) -> None:
        if self.cache.available < len(seq):
            return
        # as the scheduler does: tokens enter the tree from an allocation
        assert self.cache.allocate(len(seq))
        self.cache.release(len(seq))
        before = self.cache.total_size
        r = self.cache.insert(seq)
        aligned = len(seq) - len(seq) % self.page_size
        assert r.prefix_length + r.added == aligned
        assert self.cache.total_size == before + r.added
        assert self.cache.match_prefix(seq).length == aligned

    @rule(seq=SEQ)
    def match_is_longest_prefix_of_some_cached_sequence(self, seq: list[int]) -> None:
        expected = max((_lcp(tuple(seq), s) for s in self.cache.sequences()), default=0)
        expected -= expected % self.page_size
        assert self.cache.match_prefix(seq).length == expected

    @rule(target=locks, seq=SEQ)
    def lock(self, seq: list[int]):  # type: ignore[no-untyped-def]
        m = self.cache.match_prefix(seq)
        if m.length == 0:
            return multiple()
        self.cache.lock(m.node)
        held = (m.node, tuple(seq[: m.length]))
        self.held.append(held)
        return held

    @rule(held=consumes(locks))
    def unlock(self, held: tuple[CacheNode, tuple[int, ...]]) -> None:
        self.cache.unlock(held[0])
        self.held.remove(held)

    @rule(n=st.integers(0, 50))
    def evict(self, n: int) -> None:
        evictable = self.cache.evictable_size
        evicted = self.cache.evict(n)
        assert evicted <= evictable
        # it stops only when done or when nothing unlocked is left
        assert evicted >= n or self.cache.evictable_size == 0
        for _node, seq in self.held:
            assert self.cache.match_prefix(seq).length == len(seq)

    @rule(n=st.integers(0, 30))
    def allocate(self, n: int) -> None:
        available = self.cache.available
        ok = self.cache.allocate(n)
        assert ok == (n <= available)
        if ok:
            self.allocs.append(n)

    @rule()
    def release(self) -> None:
        if self.allocs:
            self.cache.release(self.allocs.pop())

    @invariant()
    def invariants_hold(self) -> None:
        self.cache.check_invariants()

    @invariant()
    def locked_prefixes_stay_cached(self) -> None:
        # every locked handle's path is still fully present
        for node in self._locked_nodes():
            path = []
            cur: CacheNode | None = node
            while cur is not None:
                path.append(cur)
                cur = cur.parent
            assert path[-1] is self.cache.root

    def _locked_nodes(self) -> list[CacheNode]:
        out = []
        stack = [self.cache.root]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if n.lock_ref > 0 and n is not self.cache.root:
                out.append(n)
        return out


class PagedRadixMachine(RadixMachine):
    page_size = 2


_SETTINGS = settings(max_examples=120, stateful_step_count=40, deadline=None)
TestRadixMachine = RadixMachine.TestCase
TestRadixMachine.settings = _SETTINGS
TestPagedRadixMachine = PagedRadixMachine.TestCase
TestPagedRadixMachine.settings = _SETTINGS
