"""In-flight collapsed runs of one filter process: pure asyncio state, no I/O, no tasks.

A :class:`Run` is one backend request (its *origin*, sent by this process's fan-out endpoint,
not by any client) and the chunks of its answer, appended as they arrive. Every caller of the
run, the first (its *leader*) included, is streamed those chunks by the fan-out endpoint, each
from the first chunk, as soon as it is appended (nothing is held back for a slow caller, the
origin never waits for one). So no caller owns the backend request: one that goes away only
closes its own stream. The origin runs while any caller remains: ``members`` are this process's
callers whose request is still open (counted from the plugin's choice to the end of their
ext_proc stream), ``reading`` the fan-out streams open (callers of other filter processes
too); when both fall to zero before the answer ended, ``on_idle`` cancels the origin.

A run takes new followers until its answer ends, it has ``max_followers``, or its recorded
answer passed ``max_buffer_bytes``. It is forgotten once it ended and nobody reads it (a run
published for other filter processes lingers ``remote_linger`` seconds for a follower still on
its way), and at the latest ``linger`` seconds after it ended.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

__all__ = ["Hub", "Origin", "Run", "registry_key"]


def registry_key(key: str) -> str:
    """Where a published run of ``key`` is found by other filter processes (Redis)."""
    return f"tw:{{collapse}}:{key}"


@dataclass(frozen=True)
class Origin:
    """The backend request of a run, as the leader's request would reach the pool."""

    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    endpoints: tuple[str, ...]  # the pool's replicas, in the order to try them
    # set when another filter process already runs it: read that run's fan-out stream instead
    # (``endpoints`` is then that endpoint, ``headers`` name its run), and this if it is gone
    fallback: Origin | None = None


@dataclass(eq=False)
class Run:
    key: str
    id: str
    origin: Origin | None = None
    started: bool = False  # the origin was sent (at the first caller's arrival at the fan-out)
    status: int = 0
    content_type: str = ""
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    done: bool = False
    complete: bool = False
    followers: int = 0  # callers that joined after the leader (bounded by max_followers)
    members: int = 0  # this process's callers whose request is still open
    reading: int = 0  # fan-out streams open
    published: bool = False  # other filter processes may find it (Redis)
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
        """Every chunk of the answer from the first, as each arrives; raises ``TimeoutError``
        when nothing comes for ``idle_timeout`` seconds."""
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
        remote_linger: float = 5.0,
        token: Callable[[], str] = lambda: secrets.token_hex(16),
    ) -> None:
        self.clock = clock
        self.address = address  # host:port of this process's fan-out endpoint (None: no runs)
        self.linger, self.remote_linger = linger, remote_linger
        self._token = token
        self._open: dict[str, Run] = {}  # key → run taking followers
        self._by_id: dict[str, Run] = {}
        self.on_idle: Callable[[Run], None] = lambda run: None  # cancel a started origin
        self.on_finish: Callable[[Run], None] = lambda run: None  # unpublish a published run

    def __len__(self) -> int:
        return len(self._by_id)

    def join(self, key: str, *, max_followers: int) -> Run | None:
        """The open run of ``key`` with room for one more follower (counted), or None."""
        self._sweep()
        run = self._open.get(key)
        if run is None or run.done or run.full or run.followers >= max_followers:
            return None
        if self.address is None:
            return None
        run.followers += 1
        run.members += 1
        return run

    def lead(self, key: str, origin: Origin | None = None) -> Run:
        """A new run for ``key``; the caller's request is its leader (a member)."""
        self._sweep()
        run = Run(key, self._token(), origin=origin, members=1)
        self._open.setdefault(key, run)
        self._by_id[run.id] = run
        return run

    def finish(self, run: Run, *, complete: bool) -> None:
        if run.done:
            return
        run.done, run.complete, run.finished_at = True, complete, self.clock()
        if self._open.get(run.key) is run:
            del self._open[run.key]
        run._notify()
        if run.published:
            self.on_finish(run)
        self._forget_if_read(run)

    def attach(self, run_id: str, *, max_readers: int | None = None) -> Run | None:
        """The run a fan-out stream reads (None: unknown, forgotten, or ``max_readers`` reading)."""
        self._sweep()
        run = self._by_id.get(run_id)
        if run is None or (max_readers is not None and run.reading >= max_readers):
            return None
        run.reading += 1
        return run

    def detach(self, run: Run) -> None:
        run.reading -= 1
        self._check(run)

    def leave(self, run: Run) -> None:
        """A member's request ended (served, refused before the fan-out, or its client left)."""
        run.members -= 1
        self._check(run)

    def _check(self, run: Run) -> None:
        if not run.done and run.members <= 0 and run.reading <= 0:
            if run.started:
                self.on_idle(run)  # nobody left to read it: stop the backend's work
            self.finish(run, complete=False)
        self._forget_if_read(run)

    def _forget_if_read(self, run: Run) -> None:
        if run.done and run.members <= 0 and run.reading <= 0 and not run.published:
            self._by_id.pop(run.id, None)

    def _sweep(self) -> None:
        now = self.clock()
        stale = [
            r for r in self._by_id.values()
            if r.finished_at is not None and r.reading <= 0
            and now - r.finished_at > (self.remote_linger if r.published else self.linger)
        ]  # fmt: skip
        for r in stale:
            self._by_id.pop(r.id, None)
