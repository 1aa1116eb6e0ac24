"""The picker's mapper task: fills a pool's checkpoint map off the request path, in the worker
process (:mod:`filters.plugins.picker.worker`; a call of at most ``_INLINE_BYTES`` on the event loop),
from the prompts :class:`~filters.plugins.picker.pool.PoolPicker` queues after each pick."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from filters.plugins.picker.cuts import cut_end
from filters.plugins.picker.errors import MapperDown
from filters.plugins.picker.mapper import EMULATOR, CheckpointMap, Job, Point, map_batch
from filters.plugins.picker.metrics import PickerMetrics
from filters.plugins.picker.prompt import Prompt
from filters.plugins.picker.worker import MapperWorker
from policy.routing import RoutingPolicy

__all__ = ["MapperHost", "run_mapper"]

_log = logging.getLogger("filters.plugins.picker.pool")
_SLICE = 64  # checkpoints per prompt per call of the worker process
_BATCH = 32  # prompts per call of the worker process (those queued while the last call ran)
# a call with at most this many bytes to map runs here, on the event loop: tokenizing and hashing
# 2 KB costs ~70 us, less than a round trip to the worker (~100 us of this process's CPU, and a
# wake-up of the worker's); a conversation's next turn or a question after a known document is
# usually that small (docs/benchmarks.md)
_INLINE_BYTES = 2048
# a model's tokenizer (routing.tokenizer) costs 0.3-0.7 ms per KiB here, 4-9x the emulator's words
# (bench/model_tokenizer.py): only a call this small stays on the loop
_INLINE_BYTES_MODEL = 256


class MapperHost(Protocol):
    """What the mapper reads and calls of its picker (:class:`~filters.plugins.picker.pool.PoolPicker`),
    so that this module needs no import of the picker's."""

    @property
    def pool(self) -> str: ...
    @property
    def routing(self) -> RoutingPolicy: ...
    @property
    def map(self) -> CheckpointMap: ...
    @property
    def queue(self) -> asyncio.Queue[Prompt] | None: ...
    @property
    def worker(self) -> MapperWorker | None: ...
    @property
    def metrics(self) -> PickerMetrics: ...

    def mapped(self, prompt: Prompt) -> None: ...


async def run_mapper(picker: MapperHost) -> None:
    """Map queued prompts in a worker process (the filter's event loop stays free). Each
    call takes every prompt queued meanwhile (at most ``_BATCH``), one slice of each: on a
    busy box the mapper runs behind (tens of prompts queued), and every call costs the event
    loop a frame each way; a call of at most ``_INLINE_BYTES`` runs on the loop instead. A call that fails (the worker died: the next call starts a new
    one) leaves its prompts unmapped, counted in ``map_failed``; the mapper goes on."""
    assert picker.queue is not None
    step, page = picker.routing.checkpoint_bytes, picker.routing.page_size
    every, tokenizer = picker.routing.anchor_every, picker.routing.tokenizer
    inline = _INLINE_BYTES if tokenizer == EMULATOR else _INLINE_BYTES_MODEL
    while True:
        todo = [await picker.queue.get()]
        while len(todo) < _BATCH and not picker.queue.empty():
            todo.append(picker.queue.get_nowait())
        while todo:
            jobs: list[Job] = []
            sent: list[tuple[Prompt, int, Point]] = []
            for prompt in todo:
                # the points known at its pick are not looked up (or touched) again: a long
                # prompt has hundreds, and the pick touched them moments ago
                seen = len(prompt.points)
                known = seen + len(picker.map.lookup(prompt.marks[seen:]))
                start = picker.map.start_of(prompt.marks, known, prompt.root)
                if known >= len(prompt.marks) or start is None:  # mapped, or evicted
                    picker.mapped(prompt)
                    continue
                count = min(_SLICE, len(prompt.marks) - known)
                # only the bytes still to map go to the worker process, not the whole
                # prompt (a conversation's next turn resumes where its last one was mapped)
                data = prompt.data[start.resume : cut_end(known + count, step)]
                jobs.append(
                    (prompt.marks[known : known + count], data, start, known, count,
                     start.resume)
                )  # fmt: skip
                sent.append((prompt, known, start))
            if not jobs:
                break
            try:
                if picker.worker is not None and sum(len(j[1]) for j in jobs) > inline:
                    results = await picker.worker.call(jobs, step, page, every, tokenizer)
                else:
                    results = _inline(jobs, step, page, every, tokenizer)
            except MapperDown as exc:  # their prompts map when seen again
                _log.warning("picker %s: %s; %d prompts left unmapped", picker.pool, exc,
                             len(sent))  # fmt: skip
                picker.metrics.map_failed.labels(picker.pool).inc()
                for prompt, _, _ in sent:
                    picker.mapped(prompt)
                break
            todo = []
            for (prompt, known, start), (points, hashed) in zip(sent, results, strict=True):
                picker.map.store(prompt.marks, known, start, points)
                picker.metrics.mapped_tokens.labels(picker.pool).inc(hashed)
                if known + len(points) < len(prompt.marks):
                    todo.append(prompt)  # the next slice, in the next call
                else:
                    picker.mapped(prompt)


def _inline(
    jobs: list[Job], step: int, page: int, every: int, tokenizer: str
) -> list[tuple[list[Point], int]]:
    """:func:`map_batch` on this loop; a mapping that raises fails this call only, as in the
    worker (the mapper goes on)."""
    try:
        return map_batch(jobs, step, page, every, tokenizer)
    except Exception as exc:  # any bug in the mapping: one call lost, not the task
        raise MapperDown(f"mapping failed: {exc!r}") from exc
