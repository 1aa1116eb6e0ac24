"""The one protocol of children served over their pipes (runtime/pipechild.py), on a real child
(tests/runtime/pipe_child.py): answers of several frames, what a print in the child does, a
failed call, the frame size limit on both sides, a call past its time, a dead child, closing.
The build worker (test_buildworker.py) and the picker's mapper (tests/filters/picker/
test_worker.py) test their own answers on top."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from runtime.errors import CallFailed, CallTimedOut, ChildDied, FrameTooLarge
from runtime.pipechild import FrameReader, PipeChild


async def _last(frames: FrameReader) -> bytes:
    """Frames until the ``r`` one; its payload."""
    while (frame := await frames.read())[:1] != b"r":
        pass
    return frame[1:]


def _child(*args: str, timeout: float = 30.0, max_frame: int | None = None) -> PipeChild:
    kw = {} if max_frame is None else {"max_frame": max_frame}
    return PipeChild(
        "tests.runtime.pipe_child", *args, what="the test child", timeout=timeout, **kw
    )


async def test_calls_get_their_answers_and_a_print_does_not_corrupt_them() -> None:
    child = _child()
    try:
        assert await child.exchange(b"echo:a", _last) == b"a"
        assert await child.exchange(b"two:b", _last) == b"b"  # a frame before the last one
        assert await child.exchange(b"print:c", _last) == b"c"  # the print went to stderr
        big = await child.exchange(b"big:3000000", _last)  # more than a pipe holds
        assert len(big) == 2_999_999
        assert child.restarts == 0
    finally:
        await child.aclose()


async def test_a_failed_call_fails_alone_and_the_child_lives_on() -> None:
    child = _child()
    try:
        await child.start()
        pid = child.pid
        with pytest.raises(CallFailed) as caught:
            await child.exchange(b"raise:no such thing", _last)
        assert caught.value.problems == ("ValueError: no such thing",)
        assert await child.exchange(b"echo:d", _last) == b"d"
        assert child.pid == pid and child.restarts == 0
    finally:
        await child.aclose()


async def test_the_frame_limit_holds_both_ways() -> None:
    child = _child("4096", max_frame=4096)
    try:
        await child.start()
        pid = child.pid
        with pytest.raises(FrameTooLarge, match="a request of 5000 bytes"):
            await child.exchange(b"echo:" + b"x" * 4995, _last)  # refused before it was sent
        with pytest.raises(CallFailed, match="an answer frame of 5000 bytes"):
            await child.exchange(b"big:5000", _last)  # replaced in the child
        assert await child.exchange(b"echo:e", _last) == b"e"
        assert child.pid == pid and child.restarts == 0
    finally:
        await child.aclose()


async def test_an_answer_over_the_parents_limit_kills_the_child() -> None:
    child = _child(max_frame=4096)  # the child itself allows more
    try:
        await child.start()
        pid = child.pid
        assert pid is not None
        with pytest.raises(FrameTooLarge, match="an answer frame of 5000 bytes"):
            await child.exchange(b"big:5000", _last)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed and reaped: its stream cannot be read on
        assert await child.exchange(b"echo:f", _last) == b"f"
        assert child.restarts == 1
    finally:
        await child.aclose()


async def test_a_call_past_its_time_kills_the_child_and_a_dead_one_is_replaced() -> None:
    restarted: list[int] = []
    child = PipeChild(
        "tests.runtime.pipe_child", what="the test child", timeout=0.5,
        on_restart=lambda: restarted.append(1),
    )  # fmt: skip
    try:
        await child.start()
        pid = child.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # it never answers
        with pytest.raises(CallTimedOut, match=r"took longer than 0\.5 s"):
            await child.exchange(b"echo:g", _last)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        child.timeout = 30.0  # the new child's start-up is not what this test times
        assert await child.exchange(b"echo:h", _last) == b"h"
        pid = child.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ChildDied, match="died") as caught:
            await child.exchange(b"echo:i", _last)
        assert caught.value.code is not None
        assert await child.exchange(b"echo:j", _last) == b"j"
        assert child.restarts == 2 and restarted == [1, 1]
    finally:
        await child.aclose()


async def test_closing_ends_the_child() -> None:
    child = _child()
    await child.start()
    pid = child.pid
    assert pid is not None
    await asyncio.wait_for(child.aclose(), 15)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
