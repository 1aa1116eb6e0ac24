"""Policy builds in a child process, so the serving process keeps its GIL and its CPU.

Building a 10,000-tenant policy is seconds of pure Python. In a thread of the serving process
it held the GIL: every request waited its turn behind the build (ext_proc 504s, rate-limit
calls past their 50 ms). Here a long-lived child (``python -m runtime.buildworker TARGET``,
at a lower CPU priority) runs ``TARGET(path)`` -- a module-level function returning a
:class:`runtime.watcher.Loaded` -- and streams the value back in slices
(:mod:`runtime.chunked`) that the parent unpickles between requests.

Wire: the protocol of :mod:`runtime.pipechild` (length-prefixed frames both ways, its size
limit, its timeout, its dead child). A request is the path, UTF-8; the answer is ``f`` + the
pickled tuple of files the value was built from, then the value's frames (``c`` slices, ``s``
skeleton); or one ``e`` frame: the problems (``file:line: key.path: message`` for a
:class:`~policy.PolicyError`). Anything the build prints goes to stderr.

A child that dies (killed, out of memory) is noticed at once (its stdout closes): the request
fails with :class:`WorkerCrashed`, ``restarts`` counts it, and the next request starts a new one.
A build past ``timeout`` fails with :class:`BuildTimeout` (the child is killed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import logging
import os
import pickle
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from runtime.chunked import Assembler, Container, encode
from runtime.errors import (
    BuildFailed,
    BuildTimeout,
    CallFailed,
    CallTimedOut,
    ChildDied,
    PipeCallError,
    WorkerCrashed,
    problem_lines,
)
from runtime.pipechild import FrameReader, PipeChild, error_frame, frame_output, serve_frames

__all__ = ["BuildWorker", "Built", "Target", "main", "resolve", "target_name"]

_FILES = b"f"
_log = logging.getLogger(__name__)


class Built(Protocol):
    """What a build target returns (``runtime.watcher.Loaded``): the value sent back, and the
    files it was built from."""

    @property
    def value(self) -> object: ...
    @property
    def files(self) -> tuple[Path, ...]: ...


Target = str | Callable[[Path], Built]  # a module-level function, or its "module:function"


def target_name(target: Target) -> str:
    """``"module:function"`` for a module-level function handed in by the layer above (the child
    imports it by that name, the one way to hand a function to another process)."""
    if isinstance(target, str):
        return target
    name = f"{target.__module__}:{target.__qualname__}"
    if "." in target.__qualname__ or "<" in name:
        raise ValueError(f"a build target must be a module-level function, not {name}")
    return name


NICE_ENV = "TOKENWEIR_BUILD_NICE"  # overrides --nice in the worker (0 to 19)


class BuildWorker(PipeChild):
    """One child process for ``target`` (a module-level function, or "module:function");
    ``aclose()`` stops it."""

    def __init__(
        self,
        target: Target,
        *,
        nice: int = 10,
        timeout: float = 600.0,
        on_restart: Callable[[], None] = lambda: None,
        log: logging.Logger = _log,
    ) -> None:
        self.target = target_name(target)
        self.nice = nice
        super().__init__(
            "runtime.buildworker", "--nice", str(nice), self.target,
            what=f"policy build worker for {self.target}", timeout=timeout, log=log,
            new_session=True,  # its own scheduling group where Linux has autogroups
            on_restart=on_restart,
        )  # fmt: skip

    async def build(
        self, path: Path, *, on_first_frame: Callable[[], None] = lambda: None
    ) -> tuple[object, tuple[Path, ...], list[Container]]:
        """``TARGET(path)`` in the child: its value (assembled between requests), its files and
        its large containers (:attr:`runtime.chunked.Assembler.parts`). ``on_first_frame`` is
        called when the value starts to arrive.

        Raises :class:`BuildFailed` (the build raised: its problems), :class:`WorkerCrashed`
        or :class:`BuildTimeout` (the child is then killed; the next call starts a new one).
        """

        async def receive(frames: FrameReader) -> tuple[object, tuple[Path, ...], list[Container]]:
            return await _receive(frames, on_first_frame)

        try:
            return await self.exchange(os.fsencode(path), receive)
        except CallFailed as exc:
            raise BuildFailed(exc.problems) from exc
        except CallTimedOut as exc:
            raise BuildTimeout(f"{path}: building took longer than {self.timeout:g} s") from exc
        except ChildDied as exc:
            raise WorkerCrashed(f"{path}: the build worker died (exit code {exc.code})") from exc
        except PipeCallError as exc:  # a frame over the size limit
            raise WorkerCrashed(f"{path}: the build worker failed: {exc}") from exc


async def _receive(
    frames: FrameReader, on_first_frame: Callable[[], None]
) -> tuple[object, tuple[Path, ...], list[Container]]:
    assembler: Assembler = Assembler()
    files: tuple[Path, ...] = ()
    while True:
        frame = await frames.read()
        if frame[:1] == _FILES:
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
def resolve(target: str) -> Callable[[Path], Built]:
    module, _, name = target.partition(":")
    fn: Callable[[Path], Built] = getattr(importlib.import_module(module), name)
    return fn


def _answer(fn: Callable[[Path], Built], request: bytes) -> list[bytes]:
    path = Path(os.fsdecode(request))
    try:
        loaded = fn(path)
        files = pickle.dumps(tuple(str(f) for f in loaded.files))
        return [_FILES + files, *encode(loaded.value)]
    except Exception as exc:  # any failure of the build is the answer, never the child's end
        return [error_frame(problem_lines(path, exc))]


def _collect() -> None:
    """The build's own garbage, between builds (the collector is off during them)."""
    gc.collect()


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
    out = frame_output()  # a print() in a build must not corrupt the frames
    # an operator's override for every build worker of a host (0: builds compete as equals,
    # e.g. where reload latency matters more than the request path: the test suite's workers)
    override = os.environ.get(NICE_ENV)
    _lower_priority(int(override) if override and override.strip().isdigit() else args.nice)
    gc.disable()  # a build makes no garbage cycles worth the full collections it triggers
    fn = resolve(args.target)
    logging.basicConfig(level=logging.WARNING)
    serve_frames(lambda request: _answer(fn, request), sys.stdin.buffer, out, after=_collect)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
