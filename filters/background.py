"""Fire-and-forget HTTP calls a filter-server part owns: one lazily made ``aiohttp`` session,
the tasks in flight, :meth:`wait` for them (tests, drain) and :meth:`aclose` (cancel what is
left, close the session). The backend aborter and the PD hub's prefill calls share it."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TypeVar

import aiohttp

__all__ = ["BackgroundCalls"]

T = TypeVar("T")


class BackgroundCalls:
    def __init__(self, timeout: aiohttp.ClientTimeout | None = None) -> None:
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[object]] = set()

    @property
    def session(self) -> aiohttp.ClientSession:
        """The session the calls share (made at the first call, in the running loop)."""
        if self._session is None:
            self._session = (
                aiohttp.ClientSession(timeout=self._timeout)
                if self._timeout is not None
                else aiohttp.ClientSession()
            )
        return self._session

    def spawn(self, coro: Coroutine[object, None, T], name: str | None = None) -> asyncio.Task[T]:
        """Run ``coro`` as a task of this owner; returns at once."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def wait(self) -> None:
        """Until the calls in flight are done (tests, drain)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None
