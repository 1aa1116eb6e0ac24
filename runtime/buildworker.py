"""Policy builds in a child process, so the serving process keeps its GIL and its CPU.

Building a 10,000-tenant policy is seconds of pure Python. In a thread of the serving process
it held the GIL: every request waited its turn behind the build (ext_proc 504s, rate-limit
calls past their 50 ms). Here a long-lived child (``python -m runtime.buildworker TARGET``,
at a lower CPU priority) runs ``TARGET(path)`` -- a module-level function returning a
:class:`runtime.watcher.Loaded` -- and streams the value back in slices
(:mod:`runtime.chunked`) that the parent unpickles between requests.

Wire (the child's stdout, 4-byte big-endian length before each frame): per request, ``f`` +
the pickled tuple of files the value was built from, then the value's frames (``c`` slices,
``s`` skeleton); or one ``e`` frame: the pickled tuple of problems
(``file:line: key.path: message`` for a :class:`~policy.PolicyError`). Requests
are one JSON string (the path) per line on its stdin. Anything the build prints goes to stderr.

A child that dies (killed, out of memory) is noticed at once (its stdout closes): the request
fails with :class:`WorkerCrashed`, ``restarts`` counts it, and the next request starts a new one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import json
import logging
import os
import pickle
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from runtime.children import PipeChild
from runtime.chunked import Assembler, encode
from runtime.errors import BuildFailed, BuildTimeout, WorkerCrashed

__all__ = ["BuildWorker", "main", "resolve"]

_LEN = struct.Struct(">I")
_FILES, _ERROR = b"f", b"e"
_log = logging.getLogger(__name__)


class BuildWorker(PipeChild):
    """One child process for ``target`` ("module:function"); ``aclose()`` stops it."""

    def __init__(
        self,
        target: str,
        *,
        nice: int = 10,
        timeout: float = 600.0,
        on_restart: Callable[[], None] = lambda: None,
        log: logging.Logger = _log,
    ) -> None:
        self.target = target
        self.nice = nice
        self.timeout = timeout
        self._on_restart = on_restart
        self._log = log

    async def start(self) -> None:
        """Start the child now (it imports the target once; builds then start faster)."""
        restart = await self._start(
            "runtime.buildworker", "--nice", str(self.nice), self.target,
            what=f"policy build worker for {self.target}", log=self._log,
            start_new_session=True,  # its own scheduling group where Linux has autogroups
        )  # fmt: skip
        if restart:
            self._on_restart()

    async def build(
        self, path: Path, *, on_first_frame: Callable[[], None] = lambda: None
    ) -> tuple[Any, tuple[Path, ...], list[Any]]:
        """``TARGET(path)`` in the child: its value (assembled between requests), its files and
        its large containers (:attr:`runtime.chunked.Assembler.parts`). ``on_first_frame`` is
        called when the value starts to arrive.

        Raises :class:`BuildFailed` (the build raised: its problems), :class:`WorkerCrashed`
        or :class:`BuildTimeout` (the child is then killed; the next call starts a new one).
        """
        await self.start()
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            async with asyncio.timeout(self.timeout):
                proc.stdin.write(json.dumps(str(path)).encode() + b"\n")
                await proc.stdin.drain()
                return await self._receive(proc.stdout, on_first_frame)
        except TimeoutError as exc:
            await self._kill()
            raise BuildTimeout(f"{path}: building took longer than {self.timeout:g} s") from exc
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            code = await self._kill()
            raise WorkerCrashed(f"{path}: the build worker died (exit code {code})") from exc
        except asyncio.CancelledError:
            await self._kill()  # a half-read answer cannot be resumed
            raise

    async def _receive(
        self, out: asyncio.StreamReader, on_first_frame: Callable[[], None]
    ) -> tuple[Any, tuple[Path, ...], list[Any]]:
        assembler: Assembler = Assembler()
        files: tuple[Path, ...] = ()
        while True:
            (size,) = _LEN.unpack(await out.readexactly(_LEN.size))
            frame = await out.readexactly(size)
            kind = frame[:1]
            if kind == _ERROR:
                raise BuildFailed(pickle.loads(frame[1:]))
            if kind == _FILES:
                files = tuple(Path(f) for f in pickle.loads(frame[1:]))
                on_first_frame()
                continue
            began = time.perf_counter()
            assembler.add(frame)  # one slice: a few ms of unpickling
            if assembler.done:
                return assembler.value, files, assembler.parts
            # requests run between slices, for as long as the slice took: the unpickling gets at
            # most half of this process's CPU while it serves
            await asyncio.sleep(time.perf_counter() - began)


# -- the child ---------------------------------------------------------------------------------
def resolve(target: str) -> Callable[[Path], Any]:
    module, _, name = target.partition(":")
    fn: Callable[[Path], Any] = getattr(importlib.import_module(module), name)
    return fn


def _problems(path: Path, exc: Exception) -> tuple[str, ...]:
    from policy import PolicyError  # imported by the target already

    if isinstance(exc, PolicyError):
        return tuple(str(i) for i in exc.issues)
    return (f"{path}: {type(exc).__name__}: {exc}",)


def _answer(fn: Callable[[Path], Any], path: Path) -> list[bytes]:
    try:
        loaded = fn(path)
        files = pickle.dumps(tuple(str(f) for f in loaded.files))
        return [_FILES + files, *encode(loaded.value)]
    except Exception as exc:  # any failure of the build is the answer, never the child's end
        return [_ERROR + pickle.dumps(_problems(path, exc))]


def _serve(fn: Callable[[Path], Any], requests: BinaryIO, out: BinaryIO) -> None:
    for line in requests:
        frames = _answer(fn, Path(json.loads(line)))
        for frame in frames:
            out.write(_LEN.pack(len(frame)))
            out.write(frame)
        out.flush()
        del frames
        gc.collect()  # the build's own garbage, between builds (the collector is off during them)


def _lower_priority(nice: int) -> None:
    """``nice`` steps down, and Linux's SCHED_IDLE class: the serving process wins the CPU
    whenever it can run. Where the kernel groups processes by session (``sched_autogroup``),
    nice levels and SCHED_IDLE only count inside a session, and the CPU is shared between
    sessions: the parent starts this process in a session of its own (inside the service's, its
    CPU came out of the service's share) and the session's group gets the lowest weight too
    (``/proc/self/autogroup``, nice 19). At the group's default weight, each of the three
    services' workers weighed as much as a serving process: all three starting a 10k-tenant
    build at once cost ext_proc 504s on a 2-core box the second after the edit."""
    if not nice:
        return
    os.nice(nice)
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    with contextlib.suppress(OSError):  # not Linux, or no autogroups: nothing to lower
        Path("/proc/self/autogroup").write_text(f"{min(19, nice + 9)}\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runtime.buildworker")
    ap.add_argument("--nice", type=int, default=10)
    ap.add_argument("target", help="module:function, called with a policy path")
    args = ap.parse_args(argv)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a print() in a build must not corrupt the frames
    sys.stdout = sys.stderr
    _lower_priority(args.nice)
    gc.disable()  # a build makes no garbage cycles worth the full collections it triggers
    fn = resolve(args.target)
    logging.basicConfig(level=logging.WARNING)
    _serve(fn, sys.stdin.buffer, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
