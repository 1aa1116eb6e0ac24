"""A large built value moved between processes in slices the receiving event loop can digest.

A 10,000-tenant policy is ~10^5 Python objects. Unpickling it in one call holds the GIL for
100+ ms (a C loop with no switch point): every request of that process waits. So the sender
(:func:`encode`) takes every plain ``dict`` and ``list`` with more than ``chunk`` items out of
the value and sends its items in slices of ``chunk``; the rest of the value (the "skeleton")
refers to them by number. The receiver (:class:`Assembler`) unpickles one slice at a time (a few ms each), and
the owner awaits between slices; the skeleton comes last and gets the assembled dicts back.

Frames (each ``bytes``): ``b"c" + pickle((number, is_dict, [item, ...]))`` for a slice,
``b"s" + skeleton pickle`` last. Only for values a trusted process of ours produced: pickle
runs code named by its input.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator
from typing import TypeAlias

__all__ = ["CHUNK_ITEMS", "Assembler", "Container", "encode"]

CHUNK_ITEMS = 256
_SLICE, _SKELETON = b"c", b"s"
# a large plain container taken out of the value (its items whatever the value put there)
Container: TypeAlias = "dict[object, object] | list[object]"


class _SkeletonPickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, chunk: int) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.chunk = chunk
        self.big: dict[int, tuple[int, Container]] = {}  # id -> (number, it)

    def persistent_id(self, obj: object) -> int | None:
        if (type(obj) is not dict and type(obj) is not list) or len(obj) <= self.chunk:
            return None
        found = self.big.get(id(obj))
        if found is None:
            found = self.big[id(obj)] = (len(self.big), obj)
        return found[0]


def encode(value: object, *, chunk: int = CHUNK_ITEMS) -> Iterator[bytes]:
    """The frames for ``value``: the slices of its large dicts, then its skeleton."""
    buf = io.BytesIO()
    pickler = _SkeletonPickler(buf, chunk)
    pickler.dump(value)
    for number, big in pickler.big.values():
        is_dict = type(big) is dict
        items = list(big.items()) if isinstance(big, dict) else big
        for start in range(0, len(items), chunk):
            part = (number, is_dict, items[start : start + chunk])
            yield _SLICE + pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL)
    yield _SKELETON + buf.getvalue()


class _SkeletonUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, parts: dict[int, Container]) -> None:
        super().__init__(io.BytesIO(data))
        self.parts = parts

    def persistent_load(self, pid: int) -> Container:
        return self.parts[pid]


class Assembler:
    """Feed frames in order (:meth:`add`); the value is :attr:`value` once :attr:`done`."""

    def __init__(self) -> None:
        self._parts: dict[int, Container] = {}
        self.done = False
        self.value: object = None  # unpickled: what the sending process built
        self.parts: list[Container] = []  # the large containers, assembled

    def add(self, frame: bytes) -> None:
        kind, body = frame[:1], memoryview(frame)[1:]
        if self.done:
            raise ValueError("frame after the skeleton")
        if kind == _SLICE:
            number, is_dict, items = pickle.loads(body)
            part = self._parts.get(number)
            if part is None:
                part = self._parts[number] = {} if is_dict else []
            if isinstance(part, dict):
                part.update(items)
            else:
                part.extend(items)
        elif kind == _SKELETON:
            self.value = _SkeletonUnpickler(bytes(body), self._parts).load()
            self.done = True
            self.parts = list(self._parts.values())
            self._parts = {}
        else:
            raise ValueError(f"unknown frame kind {kind!r}")
