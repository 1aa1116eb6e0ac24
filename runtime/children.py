"""Child processes: each in its own process group, logged to a file, stopped by ``aclose``.

``aclose(timeout)`` sends SIGTERM (the child drains: see ``docs/operations.md``), waits up to
``timeout`` seconds, then SIGKILLs the whole group; nothing is left running. Every child gets
the parent-death signal, so none outlives a parent that was killed without cleaning up.

No Python runs between fork and exec where it can be avoided: the parents (``tokenweir up``, a
service's worker supervisor) run gRPC threads, and Python code in a child forked from such a
process may deadlock (a lock some other thread held at the fork) or crash before its exec: a
worker that never starts. util-linux's ``setpriv --pdeathsig`` sets the signal and then execs the
program (same pid); only without ``setpriv`` does :func:`die_with_parent` run as ``preexec_fn``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from runtime.errors import ChildError, PortTimeout
from runtime.ports import wait_port

__all__ = [
    "Child",
    "ChildError",
    "checkout",
    "close_child",
    "die_with_parent",
    "kill_child",
    "reaped",
    "wait_child_line",
    "wait_child_port",
]


def checkout(src: Path | None) -> tuple[dict[str, str], Path | None]:
    """``(env, cwd)`` for a :class:`Child` that runs another checkout's code (a benchmark's
    baseline, e.g. a ``git archive`` of an older commit); ``({}, None)`` for this one's.
    ``python -m`` imports from the cwd before PYTHONPATH, so both point at ``src``."""
    if src is None:
        return {}, None
    root = src.resolve()
    return {"PYTHONPATH": str(root)}, root


# util-linux (Debian's essential set): PR_SET_PDEATHSIG, then exec
_SETPRIV = shutil.which("setpriv")


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path | None  # None: share the parent's stdout and stderr
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None  # None: the parent's (``python -m`` imports from the cwd first)
    # False: the child does not get the parent-death signal (SIGTERM when the parent dies)
    die_with_parent: bool = True
    _proc: subprocess.Popen[bytes] | None = None

    def start(self, *, append: bool = False) -> None:
        """Start the process; its log file is emptied first unless ``append`` (a restart keeps
        the log of the run that died)."""
        env = {**os.environ, **self.env}
        argv, preexec = self.argv, None
        if self.die_with_parent and _SETPRIV is not None:
            argv = [_SETPRIV, "--pdeathsig", "TERM", "--", *argv]
        elif self.die_with_parent:
            preexec = die_with_parent
        if self.log_path is None:
            self._proc = subprocess.Popen(
                argv, start_new_session=True, env=env, cwd=self.cwd, preexec_fn=preexec
            )
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab" if append else "wb") as log:
            self._proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                cwd=self.cwd,
                preexec_fn=preexec,
            )

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def log_tail(self, lines: int = 30) -> str:
        if self.log_path is None:
            return ""
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def signal(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Send ``sig`` to the child's process group (no-op once it has exited)."""
        if self._proc is not None and self._proc.poll() is None:
            _killpg(self._proc.pid, sig)

    async def wait(self, timeout: float) -> bool:
        """Whether the child exited within ``timeout`` seconds."""
        proc = self._proc
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while proc is not None and proc.poll() is None and loop.time() < deadline:
            await asyncio.sleep(0.02)
        return proc is None or proc.poll() is not None

    async def aclose(self, timeout: float = 5.0) -> None:
        """SIGTERM, up to ``timeout`` seconds to drain and exit, then SIGKILL."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            _killpg(proc.pid, signal.SIGTERM)
            if not await self.wait(timeout):
                _killpg(proc.pid, signal.SIGKILL)
                await self.wait(5.0)


def die_with_parent() -> None:
    """In the child, before exec (where there is no ``setpriv``): get SIGTERM if the parent dies without cleaning up
    (SIGKILL, a crash), so no child outlives it (Linux ``PR_SET_PDEATHSIG``)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def _killpg(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def wait_child_line(child: Child, text: str, timeout: float = 60.0) -> None:
    """Wait until ``child``'s log holds ``text`` (e.g. ``tokenweir up: ready``); fail early,
    with its log, if it exits, or after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    log = child.log_path
    while log is not None and loop.time() < end:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        if not child.alive():
            break
        await asyncio.sleep(0.1)
    raise ChildError(f"{child.name} did not get ready:\n{child.log_tail()}")


async def wait_child_port(host: str, port: int, child: Child, timeout: float = 30.0) -> None:
    """Wait until ``host:port`` accepts connections; fail early (with its log) if ``child`` exits."""
    try:
        await wait_port(host, port, timeout=timeout, alive=child.alive)
    except PortTimeout:
        raise ChildError(
            f"{child.name} did not listen on {host}:{port} within {timeout}s:\n{child.log_tail()}"
        ) from None
    except ChildError:
        raise ChildError(
            f"{child.name} exited with {child.returncode}:\n{child.log_tail()}"
        ) from None


async def reaped(proc: asyncio.subprocess.Process, timeout: float = 2.0) -> int | None:
    """An asyncio child's exit status, waiting at most ``timeout`` s: never hang a shutdown on
    it (a rate-limit service under ``tokenweir up`` once never learned its worker's exit and
    never stopped)."""
    try:
        async with asyncio.timeout(timeout):
            return await proc.wait()
    except TimeoutError:
        return proc.returncode


async def kill_child(proc: asyncio.subprocess.Process) -> int | None:
    """Kill an asyncio child (if still running) and reap it; its exit status."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    return await reaped(proc)


async def close_child(proc: asyncio.subprocess.Process) -> None:
    """End a worker that exits at the end of its input: close its stdin, wait for it a
    moment, kill it if it has not exited by then."""
    if proc.stdin is not None:
        proc.stdin.close()
    if await reaped(proc) is None:
        await kill_child(proc)
