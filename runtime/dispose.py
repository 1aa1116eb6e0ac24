"""Freeing a replaced policy a slice at a time, between requests.

When the last reference to a 10,000-tenant policy goes, CPython frees its ~10^5 objects in one
call: ~20 ms with the GIL held (more on a busy box), a stall for every request of the process.
:func:`dispose` frees the large containers of a replaced value in slices instead, yielding to
the loop between them -- but only containers that nothing else can reach: a request still in
flight on the old config may hold part of it, and emptying a dict under it would break it. So
a container is taken apart only if nothing outside the value can reach it: the value's objects
are walked (``gc.get_referents``), and an object with more references than the value itself
holds to it (a request's frame, a live cache) makes everything it reaches off limits. Otherwise
it is retried later, and after ``patience`` seconds the value is simply dropped (freed, in one
go, whenever its users finish).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from runtime.chunked import Container

__all__ = ["WORTH_IT", "Retired", "dispose", "exclusive_parts"]

_CHUNK = 256
_CAP = 10_000  # objects walked before giving up (the value is then dropped as a whole)
_STEP = 200  # objects walked between two turns of the loop (well under a millisecond)
# Below this many items in its large containers a value is freed in one go (about a
# millisecond). A 10k-tenant policy has ~20k: freed at once it held the loop 10-17 ms, and
# its walk (sliced; O(routes), not O(tenants)) 7-14 ms in one go before it was sliced.
WORTH_IT = 2_000
_OURS = ("controlplane.", "filters.", "ratelimit_service.", "runtime.", "backends.", "tests.")
_PLAIN = (dict, list, tuple, set, frozenset)


def _walked_into(obj: object) -> bool:
    """Plain data, dataclasses and our own objects; never a library's (a Redis client leads
    to the event loop and from there to everything)."""
    kind = type(obj)
    if kind in _PLAIN:
        return True
    return dataclasses.is_dataclass(kind) or kind.__module__.startswith(_OURS)


@dataclass(eq=False, slots=True)
class Retired:
    """A replaced value and its large containers (:attr:`runtime.chunked.Assembler.parts`): the
    caller's only reference to both, which :func:`dispose` empties (:meth:`clear`) when done."""

    value: object
    parts: list[Container]

    def clear(self) -> None:
        self.value, self.parts = None, []

    @property
    def cleared(self) -> bool:
        return self.value is None and not self.parts


def _big(obj: object, chunk: int) -> bool:
    return (type(obj) is dict or type(obj) is list) and len(obj) > chunk


Walked = tuple[dict[int, object], dict[int, int], dict[int, list[int]]]


def _walk(
    root: object, chunk: int, cap: int, out: list[Walked | None], step: int = _STEP
) -> Iterator[None]:
    """Everything ``root`` reaches (not into large containers, modules, types, functions):
    the objects by id, how many references each gets from the others, and the edges; put in
    ``out`` (None past ``cap`` objects). Yields every ``step`` objects: the value is frozen, so
    what it reaches does not change between slices (only who else refers to it does, and that
    is read in one go afterwards, :func:`_exclusive`)."""
    nodes: dict[int, object] = {id(root): root}
    inner: dict[int, int] = {}
    edges: dict[int, list[int]] = {}
    stack = [root]
    walked = 0
    while stack:
        walked += 1
        if walked % step == 0:
            yield
        obj = stack.pop()
        kids: list[int] = []
        edges[id(obj)] = kids
        if _big(obj, chunk):
            continue  # its items are freed with it; it is what gets taken apart
        for ref in gc.get_referents(obj):
            if not _walked_into(ref) or not (gc.is_tracked(ref) or type(ref) in (dict, list)):
                continue
            key = id(ref)
            inner[key] = inner.get(key, 0) + 1
            kids.append(key)
            if key not in nodes:
                if len(nodes) >= cap:
                    out.append(None)
                    return
                nodes[key] = ref
                stack.append(ref)
    out.append((nodes, inner, edges))


def exclusive_parts(holder: Retired, *, chunk: int = _CHUNK, cap: int = _CAP) -> list[Container]:
    """Those of the large containers ``holder.parts`` (the value's own, listed when it was built)
    that nothing outside the value ``holder.value`` can reach. ``holder`` is the caller's only
    reference to both (an object of the value that something outside references -- a
    request's frame, a live cache -- puts everything it leads to off limits)."""
    out: list[Walked | None] = []
    for _ in _walk(holder.value, chunk, cap, out):
        pass
    return _exclusive(holder, out)


async def _exclusive_parts_sliced(holder: Retired, chunk: int, cap: int) -> list[Container]:
    """:func:`exclusive_parts`, the walk yielding to the loop every ``_STEP`` objects."""
    out: list[Walked | None] = []
    for _ in _walk(holder.value, chunk, cap, out):
        await asyncio.sleep(0)
    return _exclusive(holder, out)


def _exclusive(holder: Retired, out: list[Walked | None]) -> list[Container]:
    """The reference counts, all read in one go (nothing runs in between)."""
    walked = out.pop()
    if walked is None:
        return []
    nodes, inner, edges = walked
    del walked
    root = id(holder.value)
    own = {id(part) for part in holder.parts}
    outside: list[int] = []
    for key in list(nodes):
        # getrefcount's argument and ``nodes``; the holder's references. (No local name for
        # the object: a dict items iterator would keep one more reference.)
        expected = 2 + inner.get(key, 0) + (key == root) + (key in own)
        if sys.getrefcount(nodes[key]) > expected:
            outside.append(key)
    reached = set(outside)
    while outside:
        for kid in edges.get(outside.pop(), ()):
            if kid not in reached:
                reached.add(kid)
                outside.append(kid)
    return [part for part in holder.parts if id(part) in nodes and id(part) not in reached]


async def dispose(
    holder: Retired, *, patience: float = 120.0, retry: float = 1.0, chunk: int = _CHUNK
) -> None:
    """Take apart, slice by slice, the large containers ``holder.parts`` of the value
    ``holder.value`` that nothing else reaches (``holder``: the caller's only reference to both);
    while some are still reachable from elsewhere, look again later (waits doubling from
    ``retry``), and after ``patience`` seconds drop the value as it is."""
    loop = asyncio.get_running_loop()
    end = loop.time() + patience
    wait = retry
    while not holder.cleared:
        for part in await _exclusive_parts_sliced(holder, chunk, _CAP):
            holder.parts = [p for p in holder.parts if p is not part]
            while part:
                if isinstance(part, dict):
                    for _ in range(min(chunk, len(part))):
                        part.popitem()
                else:
                    del part[-chunk:]
                await asyncio.sleep(0)
        if not holder.parts or loop.time() + wait > end:
            holder.clear()
            return
        await asyncio.sleep(wait)
        wait *= 2
