"""One pool's picker on fakes: the emulator's real radix cache publishes events into the index
(no sockets), the picker maps prompts and picks; fallbacks when it cannot know."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from backends.emulator.radix_cache import RadixCache
from backends.emulator.tokenizer import encode
from filters.plugins.picker.cuts import cut_end
from filters.plugins.picker.metrics import PickerMetrics
from filters.plugins.picker.pool import PoolPicker, feeds_for
from filters.plugins.picker.score import Pick
from policy.model import Address, LlmPool
from policy.routing import RoutingPolicy
from prefixindex.wire import KVEventBatch

NAMES = ("127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _picker(clock: Clock, **routing: object) -> tuple[PoolPicker, dict[str, RadixCache]]:
    cfg = LlmPool(
        models=("m",),
        endpoints=tuple(Address.parse(n) for n in NAMES),
        routing=RoutingPolicy(
            **{"mode": "prefix_index", "checkpoint_bytes": 64, "min_prefix_tokens": 32, **routing}  # type: ignore[arg-type]
        ),
    )
    picker = PoolPicker("chat", cfg, PickerMetrics(CollectorRegistry()), clock=clock, wall=clock)
    caches = {n: RadixCache(100_000, record_events=True) for n in NAMES}
    for n in NAMES:
        _publish(picker, n, caches[n], 0)
    return picker, caches


def _publish(picker: PoolPicker, name: str, cache: RadixCache, seq: int) -> None:
    picker.index.apply(name, seq, KVEventBatch(ts=0.0, events=cache.take_events()))
    picker.index.heard(name, picker._clock())


def _text(tag: str, words: int) -> bytes:
    return " ".join(f"{tag}{i}" for i in range(words)).encode()


def test_feeds_follow_the_port_offset() -> None:
    feeds = feeds_for((Address("10.0.0.1", 30000),), RoutingPolicy(kv_events_port_offset=7))
    assert (feeds[0].name, feeds[0].endpoint, feeds[0].replay_endpoint) == (
        "10.0.0.1:30000", "tcp://10.0.0.1:30007", "tcp://10.0.0.1:30008",
    )  # fmt: skip


def test_a_prompt_goes_where_its_prefix_is_cached_and_away_when_that_replica_goes() -> None:
    clock = Clock()
    picker, caches = _picker(clock, pending_ttl=0.0)
    doc = _text("doc", 300)
    owner = NAMES[1]
    caches[owner].insert(encode(doc.decode()))
    _publish(picker, owner, caches[owner], 1)
    prompt = picker.prompt(doc + b" a question")
    first = picker.pick(prompt)
    assert first.reason == "load"  # nothing mapped yet: the fingerprint is unknown
    picker.map.extend(prompt.data, prompt.marks, 0, len(prompt.marks))
    prompt = picker.prompt(doc + b" another question")
    pick = picker.pick(prompt)
    assert (pick.replica, pick.reason) == (owner, "cache")
    assert 250 <= pick.predicted_tokens <= 300
    picker.index.forget(owner, "disconnected")  # its process went away
    pick = picker.pick(picker.prompt(doc + b" a third question"))
    assert pick.replica not in (None, owner)


def _asked(picker: PoolPicker, doc: bytes, question: bytes) -> Pick:
    """A question after ``doc``, mapped, picked and sent (recorded) where the picker said."""
    prompt = picker.prompt(doc + question)
    picker.map.extend(prompt.data, prompt.marks, 0, len(prompt.marks))
    prompt = picker.prompt(doc + question)
    pick = picker.pick(prompt)
    picker.done(pick.replica or "", picker.record(prompt, pick))
    return pick


def test_a_busy_owner_of_a_shared_prefix_is_skipped_past_the_imbalance_bound() -> None:
    """Two requests asked different questions about the same cached document: it is a shared
    prefix, and a busy holder is skipped (a second copy elsewhere pays back)."""
    clock = Clock()
    picker, caches = _picker(clock, pending_ttl=0.0, max_imbalance=1.5, balance_window=0)
    doc = _text("doc", 300)
    caches[NAMES[0]].insert(encode(doc.decode()))
    _publish(picker, NAMES[0], caches[NAMES[0]], 1)
    assert _asked(picker, doc, b" " + _text("first", 30)).replica == NAMES[0]
    picker.inflight[NAMES[0]] = 2  # past the bound (1.5 × (2/3 + 1)); its cache still outscores
    assert _asked(picker, doc, b" " + _text("second", 30)).replica != NAMES[0]
    assert _asked(picker, doc, b" " + _text("first", 30)).replica != NAMES[0]  # the same again


def test_a_busy_owner_keeps_a_conversations_next_turn() -> None:
    """What the busy replica holds is this conversation's own history (its earlier turn, the
    generation prompt its template ended with rendered again differently): moving the next
    turn would prefill all of it again, so it stays; another conversation starting from the
    same history is a shared prefix and moves."""
    clock = Clock()
    picker, caches = _picker(clock, pending_ttl=0.0, max_imbalance=1.5, balance_window=0)
    history = _text("turn", 300)
    caches[NAMES[0]].insert(encode(history.decode()))
    _publish(picker, NAMES[0], caches[NAMES[0]], 1)
    asked = b" " + _text("question", 30)
    assert _asked(picker, history, asked + b" <|assistant|>").replica == NAMES[0]
    picker.inflight[NAMES[0]] = 2  # past the bound, as above
    follow_up = asked + b" " + _text("answer", 30) + b" " + _text("next", 20) + b" <|assistant|>"
    pick = _asked(picker, history, follow_up)
    assert (pick.replica, pick.reason) == (NAMES[0], "cache")
    other = picker.pick(picker.prompt(history + b" " + _text("elsewhere", 40)))
    assert other.replica != NAMES[0]


def test_a_busy_owner_keeps_its_prompt_while_it_was_sent_no_more_than_its_share() -> None:
    clock = Clock()
    picker, caches = _picker(clock, pending_ttl=0.0, max_imbalance=1.5)  # window 64, share 1.3
    doc = _text("doc", 300)
    caches[NAMES[0]].insert(encode(doc.decode()))
    _publish(picker, NAMES[0], caches[NAMES[0]], 1)
    prompt = picker.prompt(doc)
    picker.map.extend(prompt.data, prompt.marks, 0, len(prompt.marks))
    other = picker.prompt(b"other")
    for name in NAMES * 4:  # every replica sent as many lately
        picker.record(other, Pick(name, "load"))
        picker.done(name)
    picker.inflight[NAMES[0]] = 5
    prompt = picker.prompt(doc)
    pick = picker.pick(prompt)
    assert pick.replica == NAMES[0]
    picker.done(NAMES[0], picker.record(prompt, pick))  # the same prompt again is a shared one
    for _ in range(8):  # now it has been sent far more than the others
        picker.record(other, Pick(NAMES[0], "load"))
        picker.done(NAMES[0])
    assert picker.pick(picker.prompt(doc)).replica != NAMES[0]


def test_a_recent_pick_counts_until_its_events_arrive_then_expires() -> None:
    clock = Clock()
    picker, _ = _picker(clock, pending_ttl=5.0)
    doc = _text("fresh", 200)
    prompt = picker.prompt(doc)
    pick = picker.pick(prompt)
    picker.done(pick.replica or "", picker.record(prompt, pick))
    follow = picker.pick(picker.prompt(doc + b" next turn"))
    assert (follow.replica, follow.reason) == (pick.replica, "cache")
    clock.now += 6.0
    for n in NAMES:
        picker.index.heard(n, clock.now)
    assert picker.pick(picker.prompt(doc + b" later")).reason == "load"


def test_a_silent_index_falls_back_to_ring_hash() -> None:
    clock = Clock()
    picker, _ = _picker(clock, index_ttl=2.0)
    clock.now += 3.0  # no replica heard from within index_ttl: all unknown
    pick = picker.pick(picker.prompt(_text("x", 100)))
    assert pick.replica is None and pick.reason == "cold"


def test_in_flight_counts_never_go_negative() -> None:
    clock = Clock()
    picker, _ = _picker(clock)
    picker.done(NAMES[0])
    assert picker.inflight[NAMES[0]] == 0


def test_two_gateway_replicas_fed_the_same_events_pick_the_same_replica() -> None:
    clock = Clock()
    (one, caches), (two, _) = _picker(clock, pending_ttl=0.0), _picker(clock, pending_ttl=0.0)
    docs = [_text(f"d{i}x", 150) for i in range(6)]
    for i, doc in enumerate(docs):
        owner = NAMES[i % 3]
        caches[owner].insert(encode(doc.decode()))
    for name in NAMES:
        batch = KVEventBatch(ts=0.0, events=caches[name].take_events())
        for picker in (one, two):
            picker.index.apply(name, 1, batch)
            picker.index.heard(name, clock.now)
    for picker in (one, two):
        for doc in docs:
            p = picker.prompt(doc)
            picker.map.extend(p.data, p.marks, 0, len(p.marks))
    for i, doc in enumerate(docs):
        a, b = one.pick(one.prompt(doc + b" q")), two.pick(two.prompt(doc + b" q"))
        assert a.replica == b.replica == NAMES[i % 3] and a.reason == "cache"


def test_pending_picks_of_two_conversations_sharing_a_prefix_do_not_clobber_each_other() -> None:
    clock = Clock()
    picker, _ = _picker(clock, pending_ttl=5.0, min_prefix_tokens=0)
    shared = _text("system", 20)  # the first checkpoint is common to both
    a, b = shared + b" " + _text("alpha", 100), shared + b" " + _text("beta", 100)
    sent_b = picker.record(picker.prompt(b), Pick(NAMES[1], "load"))
    sent_a = picker.record(picker.prompt(a), Pick(NAMES[0], "load"))  # rewrites the shared mark
    picker.done(NAMES[1], sent_b)
    picker.done(NAMES[0], sent_a)
    assert picker.pick(picker.prompt(b + b" next")).replica == NAMES[1]
    assert picker.pick(picker.prompt(a + b" next")).replica == NAMES[0]


def test_once_a_prompt_is_mapped_the_index_beats_a_pending_pick() -> None:
    clock = Clock()
    picker, _ = _picker(clock, pending_ttl=5.0)
    doc = _text("evicted", 200)
    prompt = picker.prompt(doc)
    picker.done(NAMES[0], picker.record(prompt, Pick(NAMES[0], "load")))
    picker.map.extend(prompt.data, prompt.marks, 0, len(prompt.marks))
    # the replica's events never showed the document (evicted, or never stored): no cache claim
    pick = picker.pick(picker.prompt(doc + b" again"))
    assert pick.reason == "load" and pick.predicted_tokens == 0


def test_a_pending_prefix_is_counted_in_tokens_at_the_measured_bytes_per_token() -> None:
    """The mapper lags (worker process on a busy box): a follow-up of a prompt sent moments ago
    is credited from the pending pick; its tokens were estimated at 4 bytes each, so prompts of
    longer words were over-predicted (1.5x on the Mooncake slice)."""
    clock = Clock()
    picker, _ = _picker(clock, pending_ttl=5.0, min_prefix_tokens=0)
    seen = _text("calibrationwordsab", 400)  # mapped earlier: teaches the map the ratio
    old = picker.prompt(seen)
    picker.map.extend(old.data, old.marks, 0, len(old.marks))
    doc = _text("longerwordsthanfou", 400)  # ~22 bytes a word, one token each
    prompt = picker.prompt(doc)
    picker.done(NAMES[2], picker.record(prompt, Pick(NAMES[2], "load")))  # sent; not mapped yet
    follow = picker.pick(picker.prompt(doc + b" next turn"))
    assert follow.replica == NAMES[2]
    whole = cut_end(len(prompt.marks), 64)  # bytes of the pending checkpoints
    words_in_prefix = len(doc[:whole].split())
    assert 0.95 * words_in_prefix <= follow.predicted_tokens <= 1.05 * words_in_prefix


def test_a_pending_pick_waits_for_its_prompt_to_be_mapped_then_expires() -> None:
    """The mapper lagged ~20 s behind the trace on the benchmark box: a follow-up turn found its
    pending pick expired (1 s) and the index blind (text not mapped), and went elsewhere."""
    clock = Clock()
    picker, _ = _picker(clock, pending_ttl=1.0)
    picker.queue = asyncio.Queue(8)  # as start() makes it; nothing maps in this test
    doc = _text("slowmap", 200)
    prompt = picker.prompt(doc)
    picker.done(NAMES[1], picker.record(prompt, Pick(NAMES[1], "load")))
    clock.now += 10.0  # far past pending_ttl, still not mapped
    for n in NAMES:
        picker.index.heard(n, clock.now)
    follow = picker.pick(picker.prompt(doc + b" next turn"))
    assert (follow.replica, follow.reason) == (NAMES[1], "cache")
    picker.mapped(prompt)  # the mapper caught up: pending_ttl from now on
    clock.now += 1.5
    for n in NAMES:
        picker.index.heard(n, clock.now)
    assert picker.pick(picker.prompt(doc + b" later")).reason == "load"


def _mapper_cfg() -> LlmPool:
    """A pool without endpoints whose picker maps 64-byte checkpoints (the mapper tests)."""
    return LlmPool(
        models=("m",),
        endpoints=(),
        routing=RoutingPolicy(mode="prefix_index", checkpoint_bytes=64),
    )


def test_the_mapper_process_maps_only_the_bytes_it_is_sent_and_gets_the_same_points(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    from filters.plugins.picker import mapping_task

    monkeypatch.setattr(mapping_task, "_INLINE_BYTES", 0)  # small calls too: to the worker

    async def main() -> None:
        cfg = _mapper_cfg()
        picker = PoolPicker("chat", cfg, PickerMetrics(CollectorRegistry()), feeds=[])
        await picker.start(worker_process=True)
        try:
            assert picker.worker is not None
            # started at start (an empty mapping), not by the first request's prompt
            pid = picker.worker.pid
            assert pid is not None and pid != os.getpid()  # the hashing runs in the worker
            os.kill(pid, 0)  # alive
            # a conversation's second turn: only its new bytes go to the worker, same points
            turn1 = _text("a", 60)
            turn2 = turn1 + b" " + _text("b", 60)
            for data in (turn1, turn2):
                prompt = picker.prompt(data)
                picker.record(prompt, Pick("127.0.0.1:1", "load", 0))
                for _ in range(200):
                    if len(picker.map.lookup(prompt.marks)) == len(prompt.marks):
                        break
                    await asyncio.sleep(0.02)
            local = PoolPicker("x", cfg, PickerMetrics(CollectorRegistry()), feeds=[])
            marks = picker.prompt(turn2).marks
            local.map.extend(turn2, marks, 0, len(marks))
            assert picker.map.lookup(marks) == local.map.lookup(marks)
        finally:
            await picker.aclose()

    asyncio.run(main())


def test_prompts_queued_while_the_mapper_works_go_in_one_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A busy mapper takes everything queued meanwhile in one call of its worker (one slice of
    each prompt per call), and the map ends as if they had been mapped one by one."""
    import filters.plugins.picker.mapping_task as pool_mod

    calls: list[int] = []
    real = pool_mod.map_batch

    def counting(jobs, *args):  # type: ignore[no-untyped-def]
        calls.append(len(jobs))
        return real(jobs, *args)

    monkeypatch.setattr(pool_mod, "map_batch", counting)

    async def main() -> None:
        cfg = _mapper_cfg()
        picker = PoolPicker("chat", cfg, PickerMetrics(CollectorRegistry()), feeds=[])
        await picker.start(worker_process=False)
        try:
            doc = _text("d", 80)
            prompts = [picker.prompt(doc + b" " + _text(t, 5)) for t in "uvwxyz"]
            for p in prompts:  # queued before the mapper task runs: one batch
                picker.record(p, Pick("127.0.0.1:1", "load", 0))
            for _ in range(200):
                if all(len(picker.map.lookup(p.marks)) == len(p.marks) for p in prompts):
                    break
                await asyncio.sleep(0.01)
            assert calls[0] == len(prompts)
            assert len(calls) < len(prompts)
            local = PoolPicker("x", cfg, PickerMetrics(CollectorRegistry()), feeds=[])
            for p in prompts:
                local.map.extend(p.data, p.marks, len(local.map.lookup(p.marks)), len(p.marks))
                assert picker.map.lookup(p.marks) == local.map.lookup(p.marks)
        finally:
            await picker.aclose()

    asyncio.run(main())


def _runs_by_sets(
    view: dict[bytes, dict[str, float]], marks: list[bytes], now: float
) -> dict[str, int]:
    """The pending runs as first written: the replicas alive at every checkpoint so far, as
    sets intersected one checkpoint at a time (the reference for the per-replica walk)."""
    runs: dict[str, int] = {}
    alive: set[str] | None = None
    for mark in marks:
        entry = view.get(mark)
        here = {n for n, until in entry.items() if until >= now} if entry else set()
        alive = here if alive is None else alive & here
        if not alive:
            break
        for name in alive:
            runs[name] = runs.get(name, 0) + 1
    return runs


def test_pending_runs_walk_each_replica_as_the_set_intersection_did() -> None:
    """Prompts sharing prefixes of random lengths, sent to random replicas at random times,
    some mapped: every prompt's pending runs equal the set-per-checkpoint reading."""
    import random

    rng = random.Random(7)
    clock = Clock()
    picker, _ = _picker(clock, pending_ttl=1.0)
    picker.queue = asyncio.Queue(1000)  # queued picks hold until mapped, as under start()
    stems = [_text(f"s{i}", 120) for i in range(4)]
    sent = []
    for _ in range(300):
        stem = rng.choice(stems)
        prompt = picker.prompt(stem[: rng.randint(64, len(stem))] + _text("t", rng.randint(0, 40)))
        picker.record(prompt, Pick(rng.choice(NAMES), "load"))
        sent.append(prompt)
        if rng.random() < 0.3:
            picker.mapped(rng.choice(sent))
        clock.now += rng.random() * 0.4
        view = {m: {n: h.until for n, h in e.items()} for m, e in picker._pending.items()}
        for probe in rng.sample(sent, min(5, len(sent))):
            assert picker._pending_runs(probe.marks, clock.now) == _runs_by_sets(
                view, probe.marks, clock.now
            )
    assert any(picker._pending_runs(p.marks, clock.now) for p in sent[-20:])  # not all expired
