"""LoRA in the emulator: the registry, the GPU slots, the flags, the per-adapter radix cache."""

from __future__ import annotations

import pytest

from backends.emulator.__main__ import parse_args
from backends.emulator.lora import LoraRegistry, LoraSlots, adapter_of
from backends.emulator.lora_config import LoraConfig
from backends.emulator.radix_cache import RadixCache
from backends.errors import RequestError
from prefixindex.adapters import adapter_id, adapter_prior
from prefixindex.hashing import block_id, chain_digests, prefix_block_ids
from prefixindex.wire import BlockStored


def test_flags_in_sglang_forms() -> None:
    s = parse_args(
        ["--enable-lora", "--lora-paths", "a=/w/a", "/w/b",
         '{"lora_name": "c", "lora_path": "/w/c", "pinned": true}',
         "--max-loras-per-batch", "2", "--max-loaded-loras", "4", "--lora-load-ms", "5"]
    )  # fmt: skip
    lc = s.lora
    assert lc.enabled and lc.paths == (("a", "/w/a"), ("/w/b", "/w/b"), ("c", "/w/c"))
    assert lc.pinned == {"c"} and lc.max_loras_per_batch == 2 and lc.max_loaded_loras == 4
    assert lc.load_s == pytest.approx(0.005)
    assert parse_args(["--lora-paths", "x=/p"]).lora.enabled  # --lora-paths implies it
    assert not parse_args([]).lora.enabled


@pytest.mark.parametrize(
    "changes",
    [
        {"max_loras_per_batch": 0},
        {"max_loras_per_batch": 4, "max_loaded_loras": 2},  # SGLang: loaded >= per batch
        {"max_loras_per_batch": 1, "max_loaded_loras": 1, "paths": (("a", "1"), ("b", "2"))},
        {"paths": (("a", "1"), ("a", "2"))},
        {"load_s": -1.0},
    ],
)
def test_bad_lora_config_is_refused(changes: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        LoraConfig(**changes)  # type: ignore[arg-type]


def test_registry_unknown_adapter_is_sglangs_400() -> None:
    reg = LoraRegistry(LoraConfig(enabled=True, paths=(("a", "/a"),)))
    assert reg.acquire("a").lora_id == adapter_id("a")
    with pytest.raises(RequestError) as err:
        reg.acquire("nope")
    assert err.value.message == (
        "The following requested LoRA adapters are not loaded: nope\n"
        "Loaded adapters: odict_keys(['a'])."
    )


def test_registry_evicts_least_recently_used_unpinned_past_max_loaded() -> None:
    cfg = LoraConfig(
        enabled=True, paths=(("p", "/p"), ("a", "/a")), pinned=frozenset({"p"}),
        max_loras_per_batch=1, max_loaded_loras=3,
    )  # fmt: skip
    reg = LoraRegistry(cfg)
    reg.load("b", "/b")
    reg.acquire("a")  # a is now more recent than b
    reg.load("c", "/c")  # full: b (least recent, unpinned) goes; p is pinned
    assert reg.names() == ["p", "a", "c"] and reg.evictions_total == 1
    with pytest.raises(ValueError, match="already exists"):
        reg.load("a", "/a")
    with pytest.raises(ValueError, match="does not exist"):
        reg.unload("b")
    reg.unload("a")
    assert reg.loaded() == {"p": "/p", "c": "/c"}


def test_slots_hold_max_loras_per_batch_and_evict_lru_outside_the_batch() -> None:
    slots = LoraSlots(2, load_s=0.5)
    assert slots.bring_in("a", set()) == 0.5
    assert slots.bring_in("b", {"a"}) == 0.5
    assert slots.bring_in("a", {"a", "b"}) == 0.0  # resident: free, and now most recent
    assert not slots.fits({"a", "b"}, "c") and slots.fits({"a", "b"}, "a")
    assert slots.fits({"a", "b"}, None)  # the base model takes no slot
    assert slots.bring_in("c", {"a"}) == 0.5  # b: least recent and not in the batch
    assert slots.resident() == ["a", "c"] and slots.loads_total == 3


def test_adapter_named_as_sglang_reads_it() -> None:
    assert adapter_of({"lora_path": "x"}, openai=False) == "x"
    assert adapter_of({"model": "base:x"}, openai=True) == "x"
    assert adapter_of({"model": "base:x", "lora_path": "y"}, openai=True) == "y"
    assert adapter_of({"model": "base:x"}, openai=False) is None  # native reads lora_path only
    assert adapter_of({"model": "base"}, openai=True) is None
    with pytest.raises(RequestError):
        adapter_of({"lora_path": ["x"]}, openai=False)


def test_radix_cache_is_keyed_per_adapter_and_events_carry_lora_id() -> None:
    cache = RadixCache(1000, page_size=2, record_events=True)
    cache.take_events()
    prompt = [1, 2, 3, 4]
    a, b = adapter_id("a"), adapter_id("b")
    cache.insert(prompt, a)
    assert cache.match_prefix(prompt, a).length == 4
    assert cache.match_prefix(prompt).length == 0  # the base model's tree is another
    assert cache.match_prefix(prompt, b).length == 0
    (stored,) = cache.take_events()
    assert isinstance(stored, BlockStored) and stored.lora_id == a
    # the adapter's hashes chain from its seed: the gateway derives them from the name
    seeded = [block_id(d) for d in chain_digests(prompt, 2, adapter_prior(a))]
    assert stored.block_hashes == seeded and stored.parent_block_hash is None
    assert not set(seeded) & set(prefix_block_ids(prompt, 2))
    cache.insert(prompt)
    (base,) = cache.take_events()
    assert isinstance(base, BlockStored) and base.lora_id is None
    assert base.block_hashes == prefix_block_ids(prompt, 2)
    cache.insert([1, 2, 9, 9], a)  # a branch inside a's tree chains from a's first page
    (branch,) = cache.take_events()
    assert isinstance(branch, BlockStored) and branch.parent_block_hash == seeded[0]
    cache.check_invariants()
    assert cache.evict(100) == 10 and cache.total_size == 0
    cache.check_invariants()
