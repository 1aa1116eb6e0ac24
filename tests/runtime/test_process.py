"""runtime.process.serve: a signal drains, a second one cuts the drain short, nothing raises."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
from typing import NoReturn

import pytest

from runtime import process
from runtime.process import serve
from runtime.tasks import stop_task


@pytest.fixture(autouse=True)
def _unfreeze() -> object:
    """serve() freezes the process's heap; give the test process its collector back."""
    yield
    gc.unfreeze()


class FakeService:
    def __init__(self, *, fail_close: BaseException | None = None, drain_forever: bool = False):
        self.calls: list[str] = []
        self.fail_close = fail_close
        self.drain_forever = drain_forever
        self.drained_with: float | None = None
        self.drain_cancelled = False

    async def start(self) -> None:
        self.calls.append("start")
        asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGTERM)

    async def drain(self, timeout: float) -> None:
        self.calls.append("drain")
        self.drained_with = timeout
        if self.drain_forever:
            asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGINT)
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.drain_cancelled = True
                raise

    async def aclose(self) -> None:
        self.calls.append("aclose")
        if self.fail_close is not None:
            raise self.fail_close


async def test_a_signal_drains_with_the_timeout_then_closes() -> None:
    svc = FakeService()
    assert await serve(svc, drain_timeout=12.5) == 0
    assert svc.calls == ["start", "drain", "aclose"]
    assert svc.drained_with == 12.5


async def test_what_start_up_built_is_frozen_before_serving() -> None:
    """Full collections of the start-up heap stopped a loaded filter server for 27-93 ms."""
    seen: list[int] = []

    class Records(FakeService):
        async def drain(self, timeout: float) -> None:
            seen.append(gc.get_freeze_count())  # serving: start() has returned
            self.built = None
            await super().drain(timeout)

    gc.unfreeze()
    svc = Records()
    svc.built = [[i] for i in range(1000)]  # type: ignore[attr-defined]
    assert await serve(svc, drain_timeout=1) == 0
    assert seen and seen[0] >= 1000


def test_freeze_startup_heap_collects_the_garbage_first() -> None:
    import weakref

    class Node:
        pass

    gc.unfreeze()
    node = Node()
    node.me = node  # type: ignore[attr-defined]  # a cycle: only the collector frees it
    dead = weakref.ref(node)
    del node
    alive = [{"k": i} for i in range(500)]
    frozen = process.freeze_startup_heap()
    assert dead() is None  # collected, not frozen with the rest
    assert frozen == gc.get_freeze_count() >= len(alive)


async def test_a_second_signal_cuts_the_drain_short_and_still_closes() -> None:
    svc = FakeService(drain_forever=True)
    assert await serve(svc, drain_timeout=3600) == 0
    assert svc.drain_cancelled
    assert svc.calls == ["start", "drain", "aclose"]


async def test_a_failure_while_stopping_is_one_log_line_and_exit_status_1(
    caplog: pytest.LogCaptureFixture,
) -> None:
    svc = FakeService(fail_close=RecursionError("maximum recursion depth exceeded"))
    with caplog.at_level(logging.ERROR):
        assert await serve(svc, drain_timeout=1) == 1
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is None
    assert "RecursionError" in errors[0].getMessage()


async def test_stop_task_logs_a_crashed_task_once_without_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def crash() -> None:
        raise RecursionError("deep")

    task = asyncio.create_task(crash(), name="watcher")
    await asyncio.sleep(0)
    with caplog.at_level(logging.ERROR):
        await stop_task(task)  # does not raise
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "watcher" in record.getMessage() and record.exc_info is None


async def test_stop_task_passes_on_its_own_cancellation() -> None:
    never = asyncio.create_task(asyncio.Event().wait())

    async def stopper() -> None:
        await stop_task(never)

    # the stopped task swallows nothing of the caller's own cancellation
    outer = asyncio.create_task(stopper())
    await asyncio.sleep(0)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer


class StuckClose(FakeService):
    """A close that never ends; with ``deaf`` it also swallows its cancellation."""

    def __init__(self, *, deaf: bool = False) -> None:
        super().__init__()
        self.deaf = deaf
        self.close_cancelled = False

    async def drain(self, timeout: float) -> None:
        self.calls.append("drain")

    async def aclose(self) -> None:
        self.calls.append("aclose")
        asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGTERM)  # again
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.close_cancelled = True
                if not self.deaf:
                    raise


class HardExit(Exception):
    pass


def _hard_exit(code: int) -> NoReturn:
    raise HardExit(code)


async def test_a_second_signal_cuts_a_stuck_close_short(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(process, "CLOSE_GRACE", 0.2)
    svc = StuckClose()
    with caplog.at_level(logging.ERROR):
        assert await serve(svc, drain_timeout=3600, hard_exit=_hard_exit) == 1
    assert svc.close_cancelled
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "cut short" in record.getMessage() and record.exc_info is None


async def test_a_close_that_will_not_be_cancelled_ends_the_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(process, "CLOSE_GRACE", 0.2)
    svc = StuckClose(deaf=True)
    with pytest.raises(HardExit) as info:
        await serve(svc, drain_timeout=3600, hard_exit=_hard_exit)
    assert info.value.args == (1,)
    # the deaf task is still pending: end it for the test loop's sake
    svc.deaf = False
    for t in asyncio.all_tasks():
        if t.get_name() == "aclose":
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
