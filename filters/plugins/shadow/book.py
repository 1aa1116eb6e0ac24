"""The open pairs of one filter process: pure state, no I/O, no tasks (the recorder drives it).

The ``shadow`` plugin opens a pair when it samples a request (``open``), the recorder claims it
when the mirror arrives (``claim``), and each side is filled in when it ends. A pair with both
sides is handed to ``on_pair`` and forgotten. ``sweep`` settles the rest: a primary that reached
the pool but whose mirror never came ``grace`` seconds after it ended gets a shadow side
``absent``; a primary that never reached the pool (answered by a filter, a quota, a circuit
breaker) was not mirrored and is dropped; a pair older than twice its timeout plus ``grace``
is dropped whatever it holds. At most ``max_open`` pairs are open: past it nothing is sampled.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass

from runtime.shadow import Pair, Side

__all__ = ["Book", "Pending"]


@dataclass(eq=False, slots=True)
class Pending:
    id: str
    route: str
    request_id: str
    endpoints: tuple[str, ...]
    timeout: float
    keep: int
    ttl: float
    max_inflight: int
    created: float
    primary: Side | None = None
    primary_done: float | None = None
    reached: bool = False  # the primary got an answer from the pool (Envoy forwarded it)
    shadow: Side | None = None
    attached: bool = False  # the mirror reached the recorder


class Book:
    def __init__(
        self,
        clock: Callable[[], float],
        wall: Callable[[], float],
        on_pair: Callable[[Pair, Pending], None],
        *,
        max_open: int = 10_000,
        grace: float = 2.0,
        token: Callable[[], str] = lambda: secrets.token_hex(16),
    ) -> None:
        self.clock, self.wall, self.on_pair = clock, wall, on_pair
        self.max_open, self.grace, self._token = max_open, grace, token
        self._open: dict[str, Pending] = {}
        self.dropped = 0  # pairs given up without a pair (not mirrored, or stale)

    def __len__(self) -> int:
        return len(self._open)

    def open(
        self,
        route: str,
        request_id: str,
        endpoints: tuple[str, ...],
        *,
        timeout: float,
        keep: int,
        ttl: float,
        max_inflight: int = 64,
    ) -> str | None:
        """A new pair's id, or None when ``max_open`` pairs are open or there is no endpoint."""
        if len(self._open) >= self.max_open or not endpoints:
            return None
        pid = self._token()
        self._open[pid] = Pending(
            pid, route, request_id, endpoints, timeout, keep, ttl, max_inflight, self.clock()
        )
        return pid

    def claim(self, pair_id: str) -> Pending | None:
        """The open pair whose mirror this is (once; a second claim of the same id is None)."""
        p = self._open.get(pair_id)
        if p is None or p.attached:
            return None
        p.attached = True
        return p

    def primary(self, pair_id: str, side: Side, *, reached: bool) -> None:
        p = self._open.get(pair_id)
        if p is None:
            return
        p.primary, p.reached, p.primary_done = side, reached, self.clock()
        self._maybe_done(p)

    def shadow(self, pair_id: str, side: Side) -> None:
        p = self._open.get(pair_id)
        if p is None:
            return
        p.shadow = side
        self._maybe_done(p)

    def _maybe_done(self, p: Pending) -> None:
        if p.primary is not None and p.shadow is not None:
            del self._open[p.id]
            self.on_pair(Pair(p.id, p.route, p.request_id, self.wall(), p.primary, p.shadow), p)

    def sweep(self) -> None:
        now = self.clock()
        for p in list(self._open.values()):
            if p.primary is not None and not p.attached and p.primary_done is not None:
                if now - p.primary_done < self.grace:
                    continue
                if p.reached:
                    p.shadow = Side(error="absent")
                    self._maybe_done(p)
                else:  # answered before the pool: Envoy never mirrored it
                    self._drop(p)
            elif now - p.created > 2 * p.timeout + self.grace:
                self._drop(p)

    def _drop(self, p: Pending) -> None:
        self._open.pop(p.id, None)
        self.dropped += 1
