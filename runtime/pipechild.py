"""A child process served over its stdin and stdout: the one protocol of every such child.

The build worker (:mod:`runtime.buildworker`) and the picker's mapper
(``filters/plugins/picker/worker.py``) both speak it; a new child of this kind subclasses
:class:`PipeChild` and serves with :func:`serve_frames`.

Wire, both ways: a 4-byte big-endian length, then that many bytes (a *frame*). A call is one
request frame; its answer is one or more frames, each starting with a kind byte the two sides
agree on, except ``e``: the call failed, the rest is the pickled tuple of its problem lines
(:class:`CallFailed`). The caller reads frames until its answer is whole.

Limits, the same for every child:

- a frame holds at most ``max_frame`` bytes (:data:`MAX_FRAME` unless the child says less): a
  request over it is refused before it is sent (the child lives on); an answer over it is
  replaced by an ``e`` frame in the child; a length over it read by either side cannot be
  resynchronised: the parent kills the child, the child exits (:class:`FrameTooLarge`);
- a call gets ``timeout`` seconds, writing and reading included: past it the child is killed
  (:class:`CallTimedOut`), since a half-read answer cannot be resumed (a cancelled call too);
- a child that dies (killed, out of memory) is noticed at once, its stdout closing: the call
  raises :class:`ChildDied` with its exit status, ``restarts`` counts it and the next call
  starts a new child. The child exits at the end of its input: when the parent closes it,
  or dies.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import struct
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import BinaryIO, TypeVar

from runtime.children import close_child, kill_child
from runtime.errors import CallFailed, CallTimedOut, ChildDied, FrameTooLarge

__all__ = [
    "ERROR",
    "MAX_FRAME",
    "FrameReader",
    "PipeChild",
    "error_frame",
    "frame_output",
    "serve_frames",
]

MAX_FRAME = 256 * 2**20  # bytes; a policy build streams its value in slices far below this
ERROR = b"e"
_LEN = struct.Struct(">I")
_log = logging.getLogger(__name__)
T = TypeVar("T")


def error_frame(problems: Iterable[str]) -> bytes:
    """The ``e`` frame that fails a call with ``problems`` (one line each)."""
    return ERROR + pickle.dumps(tuple(problems))


class FrameReader:
    """The answer frames of one call, read from the child's stdout."""

    def __init__(self, stream: asyncio.StreamReader, max_frame: int) -> None:
        self._stream = stream
        self._max = max_frame

    async def read(self) -> bytes:
        """The next frame, kind byte first. Raises :class:`CallFailed` on an ``e`` frame."""
        (size,) = _LEN.unpack(await self._stream.readexactly(_LEN.size))
        if size > self._max:
            raise FrameTooLarge(f"an answer frame of {size} bytes (at most {self._max})")
        frame = await self._stream.readexactly(size)
        if frame[:1] == ERROR:
            raise CallFailed(pickle.loads(frame[1:]))
        return frame


class PipeChild:
    """One asyncio child process, ``python -m MODULE ARGS`` on this process's import path,
    called one call at a time; ``start`` starts it unless it runs, ``aclose`` ends it cleanly.
    ``what`` names it in the restart warning; ``new_session`` starts it in a session of its own
    (a scheduling group of its own where Linux has autogroups)."""

    def __init__(
        self,
        module: str,
        *args: str,
        what: str,
        timeout: float,
        log: logging.Logger = _log,
        max_frame: int = MAX_FRAME,
        new_session: bool = False,
        on_restart: Callable[[], None] = lambda: None,
    ) -> None:
        self.module, self.args, self.what = module, args, what
        self.timeout = timeout
        self.max_frame = max_frame
        self.restarts = 0
        self._log = log
        self._new_session = new_session
        self._on_restart = on_restart
        self._proc: asyncio.subprocess.Process | None = None
        self._crashed = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def start(self) -> None:
        """Start the child now, unless it runs (it imports its code once; calls then start
        faster). A start after a failed call counts as a restart."""
        if self._proc is not None and self._proc.returncode is None:
            return
        restart = self._crashed
        if restart:
            self.restarts += 1
            self._log.warning("%s restarted (%d so far)", self.what, self.restarts)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p or os.curdir for p in sys.path))
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", self.module, *self.args,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
            limit=2**20, start_new_session=self._new_session,
        )  # fmt: skip
        self._crashed = False
        if restart:
            self._on_restart()

    async def exchange(self, request: bytes, answer: Callable[[FrameReader], Awaitable[T]]) -> T:
        """Send ``request``; ``answer`` reads the answer's frames into its value. Raises
        :class:`CallFailed` (the child's ``e`` frame; it lives on), :class:`FrameTooLarge`,
        :class:`CallTimedOut` or :class:`ChildDied` (the child is then killed, except for a
        request refused before it was sent; the next call starts a new one)."""
        if len(request) > self.max_frame:
            raise FrameTooLarge(f"a request of {len(request)} bytes (at most {self.max_frame})")
        await self.start()
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            async with asyncio.timeout(self.timeout):
                proc.stdin.write(_LEN.pack(len(request)) + request)
                await proc.stdin.drain()
                return await answer(FrameReader(proc.stdout, self.max_frame))
        except TimeoutError as exc:
            await self._kill()
            raise CallTimedOut(f"{self.what} took longer than {self.timeout:g} s") from exc
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            code = await self._kill()
            raise ChildDied(f"{self.what} died (exit code {code})", code) from exc
        except (FrameTooLarge, asyncio.CancelledError):
            await self._kill()  # a half-read answer cannot be resumed
            raise

    async def _kill(self) -> int | None:
        proc, self._proc = self._proc, None
        self._crashed = True
        return None if proc is None else await kill_child(proc)

    async def aclose(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            await close_child(proc)


# -- the child ---------------------------------------------------------------------------------
def frame_output() -> BinaryIO:
    """The child's frame stream (its stdout); from here on ``print`` and anything else written
    to fd 1 goes to stderr, so nothing can corrupt the frames. Call it first in ``main``."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def _read(stream: BinaryIO, n: int) -> bytes | None:
    data = stream.read(n)
    return data if data is not None and len(data) == n else None


def serve_frames(
    handle: Callable[[bytes], Iterable[bytes]],
    requests: BinaryIO,
    out: BinaryIO,
    *,
    after: Callable[[], None] = lambda: None,
    max_frame: int = MAX_FRAME,
) -> None:
    """Answer calls until the end of ``requests``: ``handle(request)`` gives the answer's
    frames. A handler that raises, or an answer frame over ``max_frame``, is answered with an
    ``e`` frame (the call fails, the child lives on). ``after`` runs once each answer is sent."""
    while (head := _read(requests, _LEN.size)) is not None:
        (size,) = _LEN.unpack(head)
        if size > max_frame:
            print(
                f"a request frame of {size} bytes (at most {max_frame}): exiting", file=sys.stderr
            )
            return
        body = _read(requests, size)
        if body is None:
            return
        try:
            frames = list(handle(body))
        except Exception as exc:  # a failed call is the answer, never the child's end
            frames = [error_frame((f"{type(exc).__name__}: {exc}",))]
        if any(len(f) > max_frame for f in frames):
            sizes = max(len(f) for f in frames)
            frames = [error_frame((f"an answer frame of {sizes} bytes (at most {max_frame})",))]
        for frame in frames:  # one write per frame: the parent wakes once for it, not twice
            out.write(_LEN.pack(len(frame)) + frame)
        out.flush()
        del frames
        after()
