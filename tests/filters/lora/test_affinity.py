"""Adapter affinity (pure): holders first, bounded load, spreading a hot adapter, cheap loads."""

from __future__ import annotations

from filters.plugins.lora.affinity import MIN_SLACK, AdapterAffinity
from filters.plugins.lora.names import adapter_model
from policy.lora import LoraAdapters

R = ["r0", "r1", "r2"]


def test_an_adapter_sticks_to_its_holder() -> None:
    aff = AdapterAffinity(slots=2)
    first = aff.pick("a", R)
    for _ in range(10):
        aff.done(first or "", "a")
        assert aff.pick("a", R) == first
    assert aff.loads == 1 and aff.holders("a") == [first]


def test_new_adapters_go_to_free_slots_before_evicting() -> None:
    aff = AdapterAffinity(slots=1)
    placed = {aff.pick(name, R) for name in ("a", "b", "c")}
    assert placed == set(R)  # each replica had a free slot; nothing was evicted
    assert aff.loads == 3


def test_a_hot_adapter_spreads_past_the_bounded_load() -> None:
    aff = AdapterAffinity(slots=4, spread_factor=150)
    picks = [aff.pick("hot", R) for _ in range(30)]  # none finishes: load builds up
    assert len(set(picks)) == 3  # one replica could not carry it: it spread to all
    counts = [picks.count(r) for r in R]
    assert max(counts) - min(counts) <= MIN_SLACK + 2
    few = AdapterAffinity(slots=4)
    assert len({few.pick("warm", R) for _ in range(4)}) == 1  # a few in flight: it stays


def test_an_idle_lru_adapter_is_evicted_before_a_busy_one() -> None:
    aff = AdapterAffinity(slots=1)
    r_a = aff.pick("a", R[:2])  # a is busy (never done)
    r_b = aff.pick("b", R[:2])
    aff.done(r_b or "", "b")  # b is idle
    assert r_a != r_b
    assert aff.pick("c", R[:2]) == r_b  # c replaces the idle b, not the busy a


def test_base_colon_adapter_names_the_adapter_on_a_lora_pool_only() -> None:
    class Pool:
        models = ("m1", "sql")
        lora = LoraAdapters(adapters=("sql",))

    class Plain:
        models = ("m1",)
        lora = None

    assert adapter_model(Pool(), "m1:sql") == "sql"
    assert adapter_model(Pool(), "m1:nope") == "nope"  # unknown: the 404 names it
    assert adapter_model(Pool(), "other:sql") == "other:sql"
    assert adapter_model(Plain(), "m1:sql") == "m1:sql"
    assert adapter_model(None, "sql") == "sql"
