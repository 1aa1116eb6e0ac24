"""In-flight collapsed runs of one filter process: pure asyncio state, no I/O, no tasks.

A :class:`Run` is one backend request (its *leader*) and the chunks of its answer, appended as
the leader's response passes the filter. Followers read the chunks by index: each gets every
chunk from the first, as soon as it is appended (nothing is held back for a slow follower, the
leader never waits for one). A run takes new followers until the leader's answer ends, it has
``max_followers``, or its recorded answer passed ``max_buffer_bytes``; it is forgotten once the
leader is done and every follower has read it, or ``linger`` seconds after the leader ended
(a follower refused later, e.g. by its quota, never comes to read).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

__all__ = ["Hub", "Run"]


@dataclass(eq=False)
class Run:
    key: str
    id: str
    status: int = 0
    content_type: str = ""
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    done: bool = False
    complete: bool = False
    joined: int = 0  # followers that joined (their requests are on the way)
    reading: int = 0  # followers whose fan-out stream is open
    finished_at: float | None = None
    full: bool = False  # no new followers (buffer bound passed)
    _event: asyncio.Event = field(default_factory=asyncio.Event)

    def _notify(self) -> None:
        ev, self._event = self._event, asyncio.Event()
        ev.set()

    def headers(self, status: int, content_type: str) -> None:
        self.status, self.content_type = status, content_type
        self._notify()

    def feed(self, chunk: bytes, *, limit: int) -> None:
        if chunk:
            self.chunks.append(chunk)
            self.size += len(chunk)
            self.full = self.full or self.size > limit
            self._notify()

    async def wait_headers(self, timeout: float) -> bool:
        async with asyncio.timeout(timeout):
            while not self.status and not self.done:
                await self._event.wait()
        return bool(self.status)

    async def follow(self, idle_timeout: float) -> AsyncIterator[bytes]:
        """Every chunk of the leader's answer from the first, as each arrives; raises
        ``TimeoutError`` when the leader sends nothing for ``idle_timeout`` seconds."""
        i = 0
        while True:
            if i < len(self.chunks):
                i += 1
                yield self.chunks[i - 1]
                continue
            if self.done:
                return
            event = self._event
            async with asyncio.timeout(idle_timeout):
                await event.wait()


class Hub:
    def __init__(
        self,
        clock: Callable[[], float],
        *,
        address: str | None = None,
        linger: float = 60.0,
        token: Callable[[], str] = lambda: secrets.token_hex(16),
    ) -> None:
        self.clock = clock
        self.address = address  # host:port of this process's fan-out endpoint (None: no followers)
        self.linger = linger
        self._token = token
        self._open: dict[str, Run] = {}  # key → run taking followers
        self._by_id: dict[str, Run] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def join(self, key: str, *, max_followers: int) -> Run | None:
        """The open run of ``key`` with room for one more follower (counted), or None."""
        self._sweep()
        run = self._open.get(key)
        if run is None or run.done or run.full or run.joined >= max_followers:
            return None
        if self.address is None:
            return None
        run.joined += 1
        return run

    def lead(self, key: str) -> Run:
        """A new run for ``key``; the caller's request is its leader."""
        self._sweep()
        run = Run(key, self._token())
        self._open.setdefault(key, run)
        self._by_id[run.id] = run
        return run

    def finish(self, run: Run, *, complete: bool) -> None:
        run.done, run.complete, run.finished_at = True, complete, self.clock()
        if self._open.get(run.key) is run:
            del self._open[run.key]
        run._notify()
        self._forget_if_read(run)

    def attach(self, run_id: str) -> Run | None:
        run = self._by_id.get(run_id)
        if run is not None:
            run.reading += 1
        return run

    def detach(self, run: Run) -> None:
        run.reading -= 1
        run.joined -= 1
        self._forget_if_read(run)

    def _forget_if_read(self, run: Run) -> None:
        if run.done and run.joined <= 0 and run.reading <= 0:
            self._by_id.pop(run.id, None)

    def _sweep(self) -> None:
        now = self.clock()
        stale = [
            r for r in self._by_id.values()
            if r.finished_at is not None and now - r.finished_at > self.linger
        ]  # fmt: skip
        for r in stale:
            self._by_id.pop(r.id, None)
