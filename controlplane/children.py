"""Child processes started by ``tokenweir up``: each in its own process group, logged to a
file, stopped (SIGTERM, then SIGKILL) by ``aclose``; nothing is left running."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Child", "ChildError", "die_with_parent", "wait_port"]


class ChildError(RuntimeError):
    pass


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    _proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **self.env},
                preexec_fn=die_with_parent,
            )

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    async def aclose(self, timeout: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        _killpg(proc, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if proc.poll() is None:
            _killpg(proc, signal.SIGKILL)
            proc.wait(timeout)


def die_with_parent() -> None:
    """In the child, before exec: get SIGTERM if `tokenweir up` dies without cleaning up
    (SIGKILL, a crash), so no child outlives it (Linux ``PR_SET_PDEATHSIG``)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def _killpg(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


async def wait_port(host: str, port: int, child: Child, timeout: float = 30.0) -> None:
    """Wait until ``host:port`` accepts connections; fail early if ``child`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.alive():
            raise ChildError(f"{child.name} exited with {child.returncode}:\n{child.log_tail()}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
            return
        await asyncio.sleep(0.05)
    raise ChildError(
        f"{child.name} did not listen on {host}:{port} within {timeout}s:\n{child.log_tail()}"
    )
