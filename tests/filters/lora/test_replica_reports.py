"""Adapter affinity corrected by the replicas' reports (``/get_server_info``)."""

from __future__ import annotations

from filters.plugins.lora.affinity import AdapterAffinity
from filters.plugins.lora.hub import read_server_info

R = ("a:1", "b:1")


def test_server_info_gives_resident_and_registered_adapters() -> None:
    emulator = {
        "resident_lora_adapters": ["x", "y"],
        "loaded_lora_adapters": {"x": "/p", "z": "/q"},
    }
    assert read_server_info(emulator) == (["x", "y"], ["x", "z"])
    # SGLang at start: lora_paths as objects, nothing about slots
    sglang = {"lora_paths": [{"lora_name": "x", "lora_path": "/p"}]}
    assert read_server_info(sglang) == (None, ["x"])
    assert read_server_info({}) == (None, [])


def test_a_reported_holder_gets_the_adapter_and_an_unregistered_replica_comes_last() -> None:
    aff = AdapterAffinity(slots=2)
    aff.observe("b:1", ["sql"], ["sql"])  # another gateway's requests put sql there
    aff.observe("a:1", [], [])
    assert aff.pick("sql", R) == "b:1"
    # legal is registered on b only: a fresh adapter goes where it needs no load call
    aff.observe("a:1", [], ["sql"])
    aff.observe("b:1", ["sql"], ["sql", "legal"])
    assert aff.pick("legal", R) == "b:1"
    assert aff.registered("a:1", "legal") is False and aff.registered("c:1", "x") is None


def test_a_report_keeps_the_adapters_in_flight_and_the_slot_bound() -> None:
    aff = AdapterAffinity(slots=2)
    assert aff.pick("sql", ("a:1",)) == "a:1"  # sent, not reported yet
    aff.observe("a:1", ["x", "y", "z"], ["x", "y", "z", "sql"])
    assert aff.holders("sql") == ["a:1"]  # still in flight there
    assert len([n for n in ("x", "y", "z") if aff.holders(n)]) == 1  # two slots in all
    aff.done("a:1", "sql")
    aff.observe("a:1", ["x", "y"], ["x", "y", "sql"])
    assert aff.holders("sql") == [] and aff.holders("y") == ["a:1"]
    aff.observe("a:1", None, ["x"])  # a server that does not report its slots: the guess stays
    assert aff.holders("y") == ["a:1"] and aff.registered("a:1", "y") is False


def test_a_busy_holder_preloads_where_the_adapter_would_spread() -> None:
    aff = AdapterAffinity(slots=2)
    aff.observe("a:1", [], ["sql"])
    aff.observe("b:1", [], [])
    assert aff.pick("sql", R) == "a:1"
    assert aff.preload("sql", R, 0.75) is None  # one in flight: not busy
    for _ in range(4):
        aff.pick("sql", R)
    assert aff.preload("sql", R, 0.75) == "b:1"
    assert aff.preload("sql", R, 0.0) is None  # preload_at 0: never
    aff.registered_now("b:1", "sql")
    assert aff.preload("sql", R, 0.75) is None  # registered there already
