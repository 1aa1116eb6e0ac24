"""In-flight work and the gate that refuses new work while a process drains.

A server wraps each unit of work (an ext_proc stream, a call) in :meth:`Inflight.enter` /
:meth:`Inflight.leave`. :meth:`Inflight.drain` closes the gate (``enter`` returns False from
then on: the server answers UNAVAILABLE) and waits until the work in flight has finished or
the timeout has passed.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["Inflight"]


class Inflight:
    def __init__(self) -> None:
        self.count = 0
        self.closed = False
        self._idle: asyncio.Event | None = None

    def enter(self) -> bool:
        """Count one more unit of work; False (and nothing counted) once draining."""
        if self.closed:
            return False
        self.count += 1
        return True

    def leave(self) -> None:
        self.count -= 1
        if self.count == 0 and self._idle is not None:
            self._idle.set()

    async def drain(self, timeout: float) -> int:
        """Refuse new work; wait up to ``timeout`` s for the rest. Returns how many remain."""
        self.closed = True
        if self.count:
            self._idle = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):  # not wait_for (bpo-42130)
                    await self._idle.wait()
        return self.count
