"""The prefix index follows a radix cache used as the emulator's scheduler uses it, exactly.

A hypothesis state machine plays running requests on one small ``RadixCache``: admission
(match all but the last token, lock the match, allocate the uncached rest, evicting LRU leaves),
the end of prefill (release, insert the prompt, move the lock), decode slots, the finish (prompt
and output inserted, lock dropped), plain eviction, and flushes. Every batch of events goes
through the wire encoder and decoder into the index, with nothing lost. After every step the
index must give, for recent prompts and every sequence in the tree, exactly what
``match_prefix`` gives (rounded down to the last anchor page when only anchors are kept) (bench/routing_sim.py checks the same at every admission of a whole
trace).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from backends.emulator.radix_cache import CacheNode, RadixCache
from prefixindex.hashing import prefix_block_ids
from prefixindex.index import Applied, PrefixIndex
from prefixindex.wire import KVEventBatch, decode_for_index, encode_batch

NOW = 50.0
prompts = st.lists(st.integers(0, 4), min_size=2, max_size=16)


@dataclass
class Running:
    prompt: list[int]
    node: CacheNode
    reserved: int
    output: list[int]
    committed: bool = False


class PressureMachine(RuleBasedStateMachine):
    @initialize(
        page=st.integers(1, 3), capacity=st.integers(12, 40), every=st.sampled_from([1, 1, 2, 4])
    )
    def setup(self, page: int, capacity: int, every: int) -> None:
        self.cache = RadixCache(capacity, page_size=page, record_events=True)
        self.index = PrefixIndex(page, stale_after_s=1e9, anchor_every=every)
        self.index.add_replica("r")
        self.index.heard("r", NOW)
        self.seq = 0
        self.running: list[Running] = []
        self.probes: list[list[int]] = []
        self._deliver()

    def _deliver(self) -> None:
        events = self.cache.take_events()
        if events:
            raw = encode_batch(KVEventBatch(ts=float(self.seq), events=events))
            assert (
                self.index.apply("r", self.seq, decode_for_index(raw, self.index.anchor_every))
                is Applied.APPLIED
            )
            self.seq += 1

    @rule(prompt=prompts)
    def admit(self, prompt: list[int]) -> None:
        self.probes.append(prompt)
        match = self.cache.match_prefix(prompt[:-1])
        self.cache.lock(match.node)
        uncached = len(prompt) - match.length
        if self.cache.allocate(uncached + 1):  # may evict
            self.running.append(Running(prompt, match.node, uncached + 1, []))
        else:
            self.cache.unlock(match.node)
        self._deliver()

    @precondition(lambda self: any(not r.committed for r in self.running))
    @rule(pick=st.integers(0, 50))
    def finish_prefill(self, pick: int) -> None:
        todo = [r for r in self.running if not r.committed]
        r = todo[pick % len(todo)]
        tail = len(r.prompt) % self.cache.page_size  # a partial page stays with the request
        moved = r.reserved - 1 - tail
        self.cache.release(moved)
        r.reserved -= moved
        inserted = self.cache.insert(r.prompt)
        self.cache.lock(inserted.node)
        self.cache.unlock(r.node)
        r.node, r.committed = inserted.node, True
        self._deliver()

    @precondition(lambda self: any(r.committed for r in self.running))
    @rule(pick=st.integers(0, 50), tokens=st.lists(st.integers(0, 4), min_size=1, max_size=4))
    def decode(self, pick: int, tokens: list[int]) -> None:
        done = [r for r in self.running if r.committed]
        r = done[pick % len(done)]
        for t in tokens:
            if not self.cache.allocate(1):  # a decode slot, evicting if needed
                break
            r.reserved += 1
            r.output.append(t)
        self._deliver()

    @precondition(lambda self: any(r.committed for r in self.running))
    @rule(pick=st.integers(0, 50))
    def finish(self, pick: int) -> None:
        done = [r for r in self.running if r.committed]
        r = done[pick % len(done)]
        self.running.remove(r)
        self.cache.release(r.reserved)
        self.cache.insert([*r.prompt, *r.output])  # prompt and output, as SGLang
        self.cache.unlock(r.node)
        self.probes.append([*r.prompt, *r.output])
        self._deliver()

    @rule(n=st.integers(1, 20))
    def evict(self, n: int) -> None:
        self.cache.evict(n)
        self._deliver()

    @precondition(lambda self: not self.running)
    @rule()
    def flush(self) -> None:
        self.cache.reset()
        self._deliver()

    @precondition(lambda self: hasattr(self, "index"))
    @invariant()
    def the_index_predicts_exactly_what_the_cache_matches(self) -> None:
        self.cache.check_invariants()
        for probe in [*self.probes[-8:], *self.cache.sequences()]:
            said = self.index.query(probe, NOW)["r"]
            cached = self.cache.match_prefix(probe).length
            # exact at anchor granularity: the cache's match rounded down to its last anchor
            blocks = prefix_block_ids(probe, self.index.page_size)
            assert said == self.index.anchored(blocks, cached), (probe, said, cached)
            if self.index.anchor_every == 1:
                assert said == cached
        assert self.cache.take_events() == []  # matching records nothing


TestIndexUnderMemoryPressure = PressureMachine.TestCase
TestIndexUnderMemoryPressure.settings = settings(
    max_examples=50, stateful_step_count=30, deadline=None
)
