"""The mapper's worker process over its pipes: the same answers as the mapping in process, a
child that dies is replaced at the next call, a failed mapping fails one call only, a call past
its time kills the child, and closing stops it. Real child processes; no fakes."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable

import pytest
from prometheus_client import CollectorRegistry

from filters.plugins.picker import mapping_task
from filters.plugins.picker.errors import MapperDown
from filters.plugins.picker.mapper import ROOT, Job, map_batch
from filters.plugins.picker.metrics import PickerMetrics
from filters.plugins.picker.pool import PoolPicker
from filters.plugins.picker.prompt import checkpoints
from filters.plugins.picker.score import Pick
from filters.plugins.picker.worker import MapperWorker
from policy.model import LlmPool
from policy.routing import RoutingPolicy

STEP, PAGE = 64, 4


def _job(tag: str, words: int) -> Job:
    data = " ".join(f"{tag}{i}" for i in range(words)).encode()
    marks = checkpoints(data, STEP)
    return (marks, data[: len(marks) * STEP], ROOT, 0, len(marks), 0)


def _run(body: Callable[[MapperWorker], Awaitable[None]], **kw: float) -> None:
    async def main() -> None:
        worker = MapperWorker(**kw)
        try:
            await body(worker)
        finally:
            await worker.aclose()

    asyncio.run(main())


def test_answers_equal_the_mapping_in_this_process_large_calls_included() -> None:
    jobs = [_job("a", 50), _job("b", 400), _job("a", 50)]
    big = [_job(f"d{i}", 20_000) for i in range(3)]  # ~0.5 MB a call: more than a pipe holds

    async def body(worker: MapperWorker) -> None:
        assert await worker.call(jobs, STEP, PAGE, 4) == map_batch(jobs, STEP, PAGE, 4)
        assert await worker.call([], STEP, PAGE) == []
        assert await worker.call(big, STEP, PAGE, 16) == map_batch(big, STEP, PAGE, 16)
        assert worker.restarts == 0

    _run(body)


def test_a_killed_child_fails_one_call_and_the_next_call_starts_a_new_one() -> None:
    jobs = [_job("k", 100)]

    async def body(worker: MapperWorker) -> None:
        await worker.call(jobs, STEP, PAGE)
        old = worker.pid
        assert old is not None
        os.kill(old, signal.SIGKILL)
        with pytest.raises(MapperDown, match="died"):
            await worker.call(jobs, STEP, PAGE)
        assert await worker.call(jobs, STEP, PAGE) == map_batch(jobs, STEP, PAGE)
        assert worker.pid not in (None, old) and worker.restarts == 1

    _run(body)


def test_a_mapping_that_raises_fails_its_call_and_the_child_lives_on() -> None:
    async def body(worker: MapperWorker) -> None:
        await worker.start()
        pid = worker.pid
        marks, data, start, first, count, _ = _job("c", 80)
        bad: list[Job] = [(marks, data, start, first, count, 1)]  # its bytes start elsewhere
        with pytest.raises(MapperDown, match="the mapping failed"):
            await worker.call(bad, STEP, PAGE)
        jobs = [_job("c", 80)]
        assert await worker.call(jobs, STEP, PAGE) == map_batch(jobs, STEP, PAGE)
        assert worker.pid == pid and worker.restarts == 0

    _run(body)


def test_a_call_past_its_time_kills_the_child() -> None:
    async def body(worker: MapperWorker) -> None:
        await worker.start()
        pid = worker.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # it never answers
        with pytest.raises(MapperDown, match="longer than"):
            await worker.call([_job("t", 40)], STEP, PAGE)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed and reaped
        worker.timeout = 30.0  # the new child's start-up (imports) is not what this test times
        jobs = [_job("t", 40)]
        assert await worker.call(jobs, STEP, PAGE) == map_batch(jobs, STEP, PAGE)

    _run(body, timeout=0.5)


def test_closing_stops_the_child() -> None:
    async def main() -> None:
        worker = MapperWorker()
        await worker.start()
        pid = worker.pid
        assert pid is not None
        await worker.aclose()
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

    asyncio.run(main())


_POOL = LlmPool(
    models=("m",), endpoints=(), routing=RoutingPolicy(mode="prefix_index", checkpoint_bytes=64)
)


async def _mapped(picker: PoolPicker, data: bytes) -> bool:
    """Send ``data`` through the picker; whether the mapper maps all of it within 6 s."""
    prompt = picker.prompt(data)
    picker.record(prompt, Pick("127.0.0.1:1", "load", 0))
    for _ in range(300):
        if len(picker.map.lookup(prompt.marks)) == len(prompt.marks):
            return True
        await asyncio.sleep(0.02)
    return False


async def _lost(picker: PoolPicker, metrics: PickerMetrics, data: bytes) -> bool:
    """Send ``data`` through the picker; whether its mapping call fails (``map_failed`` 1)
    within 6 s."""
    picker.record(picker.prompt(data), Pick("127.0.0.1:1", "load", 0))
    for _ in range(300):
        if metrics.map_failed.labels("chat")._value.get() == 1:
            return True
        await asyncio.sleep(0.02)
    return False


def test_the_pool_maps_on_after_its_worker_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A killed worker costs the prompts of one call (counted in ``map_failed``), not the
    mapper: later prompts are mapped by a new worker."""
    monkeypatch.setattr(mapping_task, "_INLINE_BYTES", 0)  # every call to the worker

    async def main() -> None:
        metrics = PickerMetrics(CollectorRegistry())
        picker = PoolPicker("chat", _POOL, metrics, feeds=[])
        await picker.start(worker_process=True)
        try:
            assert await _mapped(picker, b" ".join(b"w%d" % i for i in range(300)))
            assert picker.worker is not None and picker.worker.pid is not None
            os.kill(picker.worker.pid, signal.SIGKILL)
            assert await _lost(picker, metrics, b" ".join(b"x%d" % i for i in range(300)))
            assert await _mapped(picker, b" ".join(b"y%d" % i for i in range(300)))
            assert picker.worker.restarts == 1
        finally:
            await picker.aclose()

    asyncio.run(main())


def test_small_calls_map_on_the_loop_large_ones_in_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call of at most ``_INLINE_BYTES`` costs less mapped on the loop than a round trip to
    the worker; a larger one goes to the worker. A mapping that raises on the loop fails its
    call only (counted in ``map_failed``): the mapper goes on."""
    calls: list[int] = []

    async def main() -> None:
        metrics = PickerMetrics(CollectorRegistry())
        picker = PoolPicker("chat", _POOL, metrics, feeds=[])
        await picker.start(worker_process=True)
        try:
            assert picker.worker is not None
            real = picker.worker.call

            async def counted(jobs: list[Job], *args: int) -> object:
                calls.append(sum(len(j[1]) for j in jobs))
                return await real(jobs, *args)

            monkeypatch.setattr(picker.worker, "call", counted)
            small = b" ".join(b"s%d" % i for i in range(100))  # ~500 bytes
            assert await _mapped(picker, small)
            assert calls == []  # mapped on the loop
            large = b" ".join(b"l%d" % i for i in range(1000))  # ~5 KB
            assert await _mapped(picker, large)
            assert len(calls) == 1 and calls[0] > mapping_task._INLINE_BYTES

            def broken(*args: object) -> None:
                raise ValueError("a bug in the mapping")

            monkeypatch.setattr(mapping_task, "map_batch", broken)
            assert await _lost(picker, metrics, b" ".join(b"x%d" % i for i in range(100)))
            monkeypatch.undo()
            assert await _mapped(picker, b" ".join(b"y%d" % i for i in range(100)))
        finally:
            await picker.aclose()

    asyncio.run(main())
