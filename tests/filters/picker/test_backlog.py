"""The picker's prefill backlog: tokens sent to a replica and not yet reported prefilled by its
KV events. A short prompt is not queued behind a long prefill; events drain the backlog; lost
events cannot hold it up past the requests in flight."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from backends.emulator.radix_cache import RadixCache
from backends.emulator.tokenizer import encode
from filters.plugins.picker.metrics import PickerMetrics
from filters.plugins.picker.pool import PoolPicker
from filters.plugins.picker.score import Candidate, Weights, choose
from policy.model import Address, LlmPool
from policy.routing import RoutingPolicy
from prefixindex.index import PrefixIndex
from prefixindex.wire import (
    AllBlocksCleared,
    BlockStored,
    KVEventBatch,
    decode_for_index,
    encode_batch,
)

NAMES = ("127.0.0.1:7001", "127.0.0.1:7002")
W = Weights(cache_weight=0.7, max_imbalance=3.0, min_prefix_tokens=100)


def cand(name: str, matched: int = 0, inflight: int = 0, backlog: int = 0) -> Candidate:
    return Candidate(name, True, True, matched, matched, inflight, 0, backlog)


def test_a_short_prompt_avoids_a_long_prefill_even_on_the_less_busy_replica() -> None:
    cands = [cand("a", inflight=1, backlog=28_000), cand("b", inflight=3)]
    assert choose(cands, 800, W, b"k", prompt_tokens=200).replica == "b"
    off = Weights(0.7, 3.0, 100, backlog_weight=0.0)  # backlog ignored: fewest in flight wins
    assert choose(cands, 800, off, b"k", prompt_tokens=200).replica == "a"


def test_a_prompt_with_a_useful_match_stays_with_its_cache_whatever_the_backlog() -> None:
    cands = [cand("a", matched=900, backlog=50_000), cand("b")]
    pick = choose(cands, 1000, W, b"k", prompt_tokens=1000)
    assert (pick.replica, pick.reason) == ("a", "cache")


def test_without_a_useful_match_the_shortest_wait_wins_then_the_load() -> None:
    cands = [cand("a", inflight=0, backlog=6_000), cand("b", inflight=2, backlog=1_000)]
    assert choose(cands, 4000, W, b"k", prompt_tokens=1000).replica == "b"
    even = [cand("a", inflight=0, backlog=1_000), cand("b", inflight=2, backlog=1_000)]
    assert choose(even, 4000, W, b"k", prompt_tokens=1000).replica == "a"


def _picker(**routing: object) -> tuple[PoolPicker, dict[str, RadixCache]]:
    settings: dict[str, object] = {
        "mode": "prefix_index", "checkpoint_bytes": 64, "min_prefix_tokens": 32,
        "pending_ttl": 0.0, "balance_window": 0, **routing,
    }  # fmt: skip  # in-flight counts place prompts here (test_balance: the window's shares)
    cfg = LlmPool(
        models=("m",),
        endpoints=tuple(Address.parse(n) for n in NAMES),
        routing=RoutingPolicy(**settings),  # type: ignore[arg-type]
    )
    picker = PoolPicker("chat", cfg, PickerMetrics(CollectorRegistry()), clock=lambda: 1.0)
    caches = {n: RadixCache(1_000_000, record_events=True) for n in NAMES}
    for n in NAMES:
        _publish(picker, n, caches[n], 0)
    # the map measures the text's bytes per token (as it does on the first prompts it maps)
    seen = picker.prompt(_text("seen", 500))
    picker.map.extend(seen.data, seen.marks, 0, len(seen.marks))
    return picker, caches


def _publish(picker: PoolPicker, name: str, cache: RadixCache, seq: int) -> None:
    picker.index.apply(name, seq, KVEventBatch(ts=0.0, events=cache.take_events()))
    picker.index.heard(name, 1.0)


def _text(tag: str, words: int) -> bytes:
    return " ".join(f"{tag}{i}" for i in range(words)).encode()


def test_a_long_prompt_sent_makes_a_backlog_its_events_drain() -> None:
    picker, caches = _picker(backlog_allowance=1_000)
    long = _text("long", 3_000)
    prompt = picker.prompt(long)
    pick = picker.pick(prompt)
    owner = pick.replica
    assert owner is not None
    added = picker.record(prompt, pick)
    assert 2_700 < added <= 3_450 and picker.backlog[owner] == added  # ~3,000 tokens
    other = next(n for n in NAMES if n != owner)
    picker.inflight[other] = 2  # busier by count than the owner (1)
    # a short prompt goes to the other replica all the same: not behind the long prefill
    short = picker.prompt(_text("short", 20))
    assert picker.pick(short).replica == other
    # the owner reports the long prompt prefilled (its 3,000 blocks stored): the backlog is
    # gone, but for what the estimate of its length was off by (until the request ends)
    caches[owner].insert(encode(long.decode()))
    _publish(picker, owner, caches[owner], 1)
    assert picker.pick(short).replica == owner  # (a pick reads the events' progress)
    assert picker.backlog[owner] == max(0, added - 3_000)
    picker.done(owner, added)
    assert picker.backlog[owner] == 0 and picker.inflight[owner] == 0


def test_backlog_under_the_allowance_costs_nothing() -> None:
    picker, _ = _picker()  # the default allowance: about one prefill step (8,192 tokens)
    first = picker.prompt(_text("one", 3_000))
    pick = picker.pick(first)
    picker.record(first, pick)
    other = next(n for n in NAMES if n != pick.replica)
    picker.inflight[other] = 2
    assert picker.pick(picker.prompt(_text("short", 20))).replica == pick.replica


def test_lost_events_cannot_hold_a_backlog_past_the_requests_in_flight() -> None:
    picker, _ = _picker(backlog_allowance=0)
    first = picker.prompt(_text("one", 1_000))
    pick = picker.pick(first)
    owner = pick.replica or ""
    a = picker.record(first, pick)
    second = picker.prompt(_text("two", 1_000))
    pick2 = picker.pick(second)
    b = picker.record(second, pick2)
    assert pick2.replica != owner  # the second avoided the first's backlog
    picker.done(owner, a)  # no event ever came: the request ended all the same
    assert picker.backlog[owner] == 0
    assert picker.backlog[pick2.replica or ""] == b


def test_the_index_counts_every_stored_block_even_those_it_does_not_keep() -> None:
    index = PrefixIndex(4, anchor_every=16)  # keeps about one block in 16
    index.add_replica("r")
    stored = BlockStored(list(range(1, 101)), None, list(range(400)), 4, None)
    raw = encode_batch(KVEventBatch(ts=0.0, events=[AllBlocksCleared(), stored]))  # a baseline
    index.apply("r", 0, decode_for_index(raw, 16))
    assert index.stored_tokens("r") == 400
    assert index.blocks_of("r") < 100
    index.apply("r", 0, decode_for_index(raw, 16), live=False)  # a replayed duplicate: nothing
    assert index.stored_tokens("r") == 400
