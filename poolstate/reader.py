"""The reader services run: long-polls the control plane's ``GET /api/v1/pools`` and keeps the
last state (filters, the rate-limit service, anything that decides on load).

:attr:`PoolStateReader.state` is what to decide on. While the control plane cannot be reached
for longer than ``stale_after_s``, it is the last state with every replica marked stale and
saturated (:func:`mark_stale`): a reader never mistakes silence for an idle pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import replace

import aiohttp

from poolstate.errors import PoolStateDecodeError
from poolstate.state import SATURATED, PoolState, PoolSummary
from runtime.tasks import stop_task

__all__ = ["POOLS_PATH", "PoolStateReader", "mark_stale", "pools_url"]

log = logging.getLogger("tokenweir.poolstate")

POOLS_PATH = "/api/v1/pools"  # served on the control plane's metrics address


def pools_url(host: str, port: int, *, https: bool = False) -> str:
    """The pool-state URL of a control plane whose metrics address is ``host:port``."""
    return f"{'https' if https else 'http'}://{host}:{port}{POOLS_PATH}"


def mark_stale(state: PoolState) -> PoolState:
    """Pure: ``state`` with every replica stale and saturated (version and time kept)."""
    pools = {
        name: PoolSummary(
            {ep: replace(r, stale=True, saturation=SATURATED) for ep, r in p.endpoints.items()},
            p.capacity_running,
            p.capacity_queued,
        )
        for name, p in state.pools.items()
    }
    return PoolState(state.version, state.ts, pools)


class PoolStateReader:
    """Owns one long-poll task; ``aclose`` stops it."""

    def __init__(
        self,
        url: str,
        *,
        clock: Callable[[], float],
        stale_after_s: float = 3.0,
        poll_timeout_s: float = 1.0,
        retry_s: float = 0.25,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        # the control plane's admin token (runtime.admin_auth), when its surfaces want one
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        if not stale_after_s > poll_timeout_s:
            # an idle pool publishes nothing new: the answer to a long poll comes only after
            # poll_timeout_s, and that silence must not read as an unreachable control plane
            raise ValueError("stale_after_s must exceed poll_timeout_s")
        self.url = url.rstrip("/")
        self._clock = clock
        self.stale_after_s = stale_after_s
        self.poll_timeout_s = poll_timeout_s
        self.retry_s = retry_s
        self._sleep = sleep
        self._last = PoolState()
        self._heard_at: float | None = None  # clock value of the last answer
        self._updated = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.errors = 0

    # ---- what services read ------------------------------------------------------------------
    @property
    def stale(self) -> bool:
        return self._heard_at is None or self._clock() - self._heard_at > self.stale_after_s

    @property
    def state(self) -> PoolState:
        return mark_stale(self._last) if self.stale else self._last

    def accept(self, doc: object) -> bool:
        """Take one answer of the API (the loop calls this); False when it is not a state."""
        try:
            state = PoolState.from_json(doc)
        except PoolStateDecodeError as exc:
            log.warning("pool state rejected, keeping version %d: %s", self._last.version, exc)
            return False
        self._heard_at = self._clock()
        if state.version != self._last.version or not self._last.pools:
            self._last = state
            self._updated.set()
            self._updated = asyncio.Event()
        return True

    async def first(self, timeout_s: float) -> bool:
        """Until the first answer (True), or ``timeout_s`` (False): a service starts this
        reader, then waits here (bounded) so its first requests decide on a real state."""
        end = self._clock() + timeout_s
        while self._heard_at is None:
            left = end - self._clock()
            if left <= 0:
                return False
            await self.wait_update(left)
        return True

    async def wait_update(self, timeout_s: float) -> PoolState:
        """Until a new version arrives, or ``timeout_s``."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._updated.wait()
        return self.state

    # ---- the loop ----------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="tokenweir-pool-state-reader")

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.poll_timeout_s + 5.0)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                params = {"timeout": f"{self.poll_timeout_s:g}"}
                if self._heard_at is not None:
                    params["after_version"] = str(self._last.version)
                try:
                    async with http.get(
                        self.url, params=params, headers=self._headers, ssl=self._ssl
                    ) as r:
                        ok = r.status == 200 and self.accept(await r.json(content_type=None))
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    log.debug("pool state unreachable: %r", exc)
                    ok = False
                if not ok:
                    self.errors += 1
                    await self._sleep(self.retry_s)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        await stop_task(task, log=log)
