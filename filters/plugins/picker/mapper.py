"""Checkpoint → backend block hash: the bridge between the cheap fingerprint and the KV events.

The prefix index knows SGLang block hashes (SHA-256 chained per page of token ids); a request
carries text. Hashing every page of every prompt on the request path costs ~1 µs+ per page in
Python (53 ms for 12k tokens at page size 1). So the request path only computes checkpoints
(:mod:`filters.plugins.picker.prompt`) and looks them up here; this map is filled *off the request path*
(:class:`filters.plugins.picker.pool.PoolPicker` runs ``extend`` in a background task after the pick),
incrementally: a prompt whose first ``k`` checkpoints are known resumes tokenizing and hashing at
checkpoint ``k``, so a conversation's next turn costs only its new text.

For checkpoint ``k`` (bytes ``[0, cut_end(k, step))``: :mod:`filters.plugins.picker.cuts`) the tokens are the words that end, followed by
whitespace, before the cut (the emulator's tokenizer: one token per whitespace-separated word,
id = CRC-32 of its UTF-8 bytes); a word touching the cut is left to the next checkpoint, so the
tokens depend only on the bytes before the cut. The block hash stored is that of the last whole
*anchor* page of those tokens (every page when the index keeps every block; with
``anchor_every`` > 1 the last page whose hash is an anchor, as the index keeps only those:
:mod:`prefixindex.index`). Non-ASCII whitespace (which the emulator's ``str.split`` also splits on)
makes a prediction differ from the backend's hashes: the index then finds nothing and the
answer is lower, never wrong. With a model's own tokenizer (``routing.tokenizer`` a model
directory) the tokens kept at each cut are those :meth:`chat.tokenizer.HfChatTokenizer.stable`
says no later text can change (every pre-token but the last two), the same ids the whole prompt
gives.

Pure (no I/O, no clock); bounded (least recently used entries go first).
"""

from __future__ import annotations

import array
import collections
import sys
import zlib
from collections.abc import Callable, Sequence
from typing import NamedTuple

from chat.tokenizer import HfChatTokenizer
from filters.plugins.picker.cuts import cut_end
from policy.routing import EMULATOR_TOKENIZER
from prefixindex.adapters import adapter_id, adapter_prior
from prefixindex.hashing import block_id, raw_chain
from prefixindex.wire import anchor_mask

__all__ = ["EMULATOR", "ROOT", "CheckpointMap", "Job", "Point", "adapter_root", "map_batch",
           "map_points", "model_tokenizer"]  # fmt: skip

EMULATOR = EMULATOR_TOKENIZER  # routing.tokenizer: the emulator's word tokenizer
# a tokenizer's view of the rest of a prompt: the ids no later text changes, the bytes they cover
_Split = Callable[[bytes], tuple[list[int], int]]

_SWAP = sys.byteorder != "little"  # token ids hash as 4-byte little-endian


class Point(NamedTuple):
    """What is known at one checkpoint of a prompt. A named tuple, not a dataclass: the worker
    process sends these back by the dozen per call, and a tuple pickles in C (a slots dataclass
    pickles through ``dataclasses`` in Python: 2x the CPU to dump, 5x to load)."""

    resume: int  # byte offset where the not yet tokenized text starts (<= the cut)
    tokens: int  # tokens before ``resume``
    digest: bytes  # chain digest after the whole pages of those tokens (b"" = none yet)
    tail: tuple[int, ...]  # token ids of the partial last page
    block: int | None  # block hash of the last whole anchor page (None before the first)
    anchored: int = 0  # tokens up to and including that page

    @property
    def cached_tokens(self) -> int:
        """Tokens the block covers (whole pages up to the last anchor)."""
        return self.anchored


ROOT = Point(0, 0, b"", (), None)


def adapter_root(adapter: str | None) -> Point:
    """The point before a prompt's first token: ``ROOT`` for the base model; for a LoRA adapter,
    its pages chain from the adapter's seed (:mod:`prefixindex.adapters`), as the backend's
    per-adapter radix cache hashes them, so its blocks never match the base model's."""
    if adapter is None:
        return ROOT
    prior = adapter_prior(adapter_id(adapter))
    assert prior is not None
    return Point(0, 0, prior, (), None)


def map_points(
    data: bytes,
    start: Point,
    first: int,
    count: int,
    step: int,
    page: int,
    anchor_every: int = 1,
    base: int = 0,
    tokenizer: str = EMULATOR,
) -> list[Point]:
    """Pure: the points of checkpoints ``first + 1 .. first + count`` of a prompt, from the
    point of checkpoint ``first`` (``ROOT`` for 0). ``data`` is the prompt's bytes from offset
    ``base`` on (at most ``start.resume``), so a caller sends only what is still to be mapped.
    ``tokenizer``: ``emulator`` or a model directory (:func:`model_tokenizer`). Runs in a worker
    process (picklable)."""
    if base > start.resume:
        raise ValueError("base is past the point to resume from")
    mask = anchor_mask(anchor_every)
    split = _emulator_ids if tokenizer == EMULATOR else model_tokenizer(tokenizer).stable
    out: list[Point] = []
    point = start
    for k in range(first + 1, first + count + 1):
        point = _advance(data, base, point, cut_end(k, step), page, mask, split)
        out.append(point)
    return out


def model_tokenizer(path: str) -> HfChatTokenizer:
    """The model tokenizer at ``path``, loaded once per process (the worker's, the filter
    server's)."""
    tok = _MODELS.get(path)
    if tok is None:
        tok = _MODELS[path] = HfChatTokenizer.load(path)
    return tok


_MODELS: dict[str, HfChatTokenizer] = {}


def _emulator_ids(segment: bytes) -> tuple[list[int], int]:
    """The emulator's tokens of ``segment`` that end before it does (a word touching the end is
    left to the next checkpoint), and the bytes they cover."""
    words = segment.split()
    used = len(segment)
    if words and not segment[-1:].isspace():
        used -= len(words.pop())
    return [zlib.crc32(w) for w in words], used


# one prompt's slice for map_batch: its marks from ``first`` on (``count`` of them), the bytes from
# ``base`` on, the point of checkpoint ``first``, ``first``, ``count``, ``base``
Job = tuple[Sequence[bytes], bytes, Point, int, int, int]


def map_batch(
    jobs: Sequence[Job], step: int, page: int, anchor_every: int = 1, tokenizer: str = EMULATOR
) -> list[tuple[list[Point], int]]:
    """Pure: :func:`map_points` for each job in order, except that a job whose checkpoints an
    earlier job of the same call already computed (the same conversation's earlier turn, the same
    document queued twice) takes those points instead of hashing the text again. Returns, per job,
    its ``count`` points and the tokens it hashed itself. Runs in a worker process (picklable);
    one call carries what queued up while the last one ran."""
    done: dict[bytes, Point] = {}
    out: list[tuple[list[Point], int]] = []
    for marks, data, start, first, count, base in jobs:
        k = 0
        while k < count and marks[k] in done:
            k += 1
        points = [done[m] for m in marks[:k]]
        point = points[-1] if points else start
        fresh = map_points(
            data, point, first + k, count - k, step, page, anchor_every, base, tokenizer
        )
        for mark, p in zip(marks[k:count], fresh, strict=True):
            done[mark] = p
        points += fresh
        out.append((points, fresh[-1].tokens - point.tokens if fresh else 0))
    return out


def _advance(
    data: bytes, base: int, point: Point, cut: int, ps: int, mask: int, split: _Split
) -> Point:
    ids, used = split(data[point.resume - base : cut - base])
    resume = point.resume + used
    pending = [*point.tail, *ids]
    whole = len(pending) - len(pending) % ps
    digest, block, anchored = point.digest, point.block, point.anchored
    if whole:
        packed = array.array("I", pending[:whole])
        if _SWAP:
            packed.byteswap()
        digests = raw_chain(packed.tobytes(), 4 * ps, digest)
        digest = digests[-1]
        for j in range(len(digests) - 1, -1, -1):  # the last anchor page (every page at mask 0)
            if not digests[j][7] & mask:  # the block id's low byte
                block = block_id(digests[j])
                anchored = point.tokens - len(point.tail) + (j + 1) * ps
                break
    return Point(resume, point.tokens + len(ids), digest, tuple(pending[whole:]), block, anchored)


class CheckpointMap:
    """checkpoint digest → :class:`Point`; see the module docstring."""

    def __init__(
        self, page_size: int, step: int, *, max_points: int = 500_000, anchor_every: int = 1
    ) -> None:
        if page_size <= 0 or step <= 0 or max_points <= 0:
            raise ValueError("page_size, step and max_points must be > 0")
        anchor_mask(anchor_every)  # checked here, not first in the worker process
        self.page_size = page_size
        self.step = step
        self.anchor_every = anchor_every
        self.max_points = max_points
        self._points: collections.OrderedDict[bytes, Point] = collections.OrderedDict()
        self.tokens_hashed = 0  # work done, for metrics and the benchmark
        self.bytes_mapped = 0  # the text those tokens came from (bytes_per_token)

    def __len__(self) -> int:
        return len(self._points)

    def lookup(self, marks: Sequence[bytes]) -> list[Point]:
        """The known points of ``marks`` (a prompt's checkpoints), from the first, in a row."""
        out: list[Point] = []
        points = self._points
        get, touch, add = points.get, points.move_to_end, out.append
        for mark in marks:
            point = get(mark)
            if point is None:
                break
            touch(mark)
            add(point)
        return out

    def start_of(self, marks: Sequence[bytes], known: int, root: Point = ROOT) -> Point | None:
        """The point to resume from after the first ``known`` checkpoints (None: evicted);
        ``root``: the prompt's point before its first token (:func:`adapter_root`)."""
        return root if known == 0 else self._points.get(marks[known - 1])

    def store(
        self, marks: Sequence[bytes], first: int, start: Point, points: Sequence[Point]
    ) -> None:
        """Remember ``points`` (``map_points(..., start, first, ...)``) for checkpoints
        ``first + 1 ..``."""
        for i, point in enumerate(points):
            self._put(marks[first + i], point)
        if points:
            self.tokens_hashed += points[-1].tokens - start.tokens
            self.bytes_mapped += points[-1].resume - start.resume

    def bytes_per_token(self) -> float:
        """Bytes of prompt text per backend token, measured over what was mapped (4 before
        anything was: a common average of BPE tokenizers on English)."""
        if self.tokens_hashed <= 0:
            return 4.0
        return self.bytes_mapped / self.tokens_hashed

    def extend(
        self, data: bytes, marks: Sequence[bytes], known: int, budget: int, root: Point = ROOT
    ) -> int:
        """In this process: compute up to ``budget`` more points of ``data`` after its first
        ``known`` ones (``marks`` = ``checkpoints(data, step)``); returns how many are known."""
        if known > len(marks):
            raise ValueError("known exceeds the checkpoints given")
        start = self.start_of(marks, known, root)
        if start is None:
            return 0  # evicted meanwhile: start over next time
        count = min(budget, len(marks) - known)
        points = map_points(data, start, known, count, self.step, self.page_size, self.anchor_every)
        self.store(marks, known, start, points)
        return known + count

    def _put(self, mark: bytes, point: Point) -> None:
        self._points[mark] = point
        self._points.move_to_end(mark)
        while len(self._points) > self.max_points:
            self._points.popitem(last=False)
