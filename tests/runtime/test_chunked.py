"""A built value crosses from the build worker in slices, and comes back whole."""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import pytest

from runtime.chunked import Assembler, encode


@dataclass(frozen=True)
class _Tenant:
    tier: str
    keys: tuple[str, ...]


def _roundtrip(value: object, chunk: int = 4) -> tuple[object, list[bytes], Assembler]:
    frames = list(encode(value, chunk=chunk))
    assembler = Assembler()
    for frame in frames:
        assert not assembler.done
        assembler.add(frame)
    assert assembler.done
    return assembler.value, frames, assembler


def test_large_dicts_and_lists_are_sent_in_slices_and_come_back_equal() -> None:
    tenants = {f"t{i}": _Tenant("std", (f"k{i}",)) for i in range(10)}
    value = {"tenants": tenants, "order": list(range(9)), "small": {"a": [1, 2]}}
    back, frames, assembler = _roundtrip(value)
    assert back == value
    # 10 tenants in slices of 4 (3 frames), 9 ids (3 frames), the skeleton
    assert len(frames) == 7
    assert not any(b"t9" in f for f in frames[-1:])  # the skeleton does not carry them
    assert sorted(len(p) for p in assembler.parts) == [9, 10]


def test_a_container_referenced_twice_is_one_object_again() -> None:
    shared = {i: str(i) for i in range(10)}
    back, _, _ = _roundtrip({"a": shared, "b": [shared]})
    assert isinstance(back, dict) and back["a"] is back["b"][0]


def test_small_values_are_one_frame() -> None:
    back, frames, assembler = _roundtrip({"x": 1})
    assert back == {"x": 1} and len(frames) == 1 and assembler.parts == []


def test_a_frame_after_the_skeleton_or_of_unknown_kind_is_refused() -> None:
    frames = list(encode({"x": 1}))
    assembler = Assembler()
    with pytest.raises(ValueError, match="unknown frame kind"):
        assembler.add(b"z" + pickle.dumps(1))
    assembler.add(frames[0])
    with pytest.raises(ValueError, match="after the skeleton"):
        assembler.add(frames[0])
