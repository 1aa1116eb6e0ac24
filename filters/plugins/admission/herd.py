"""The clients already told when to come back, per lane. Pure (``now`` passed in).

* Each shed client is told a later time than the ones told before it (those told a time still
  to come: :meth:`Promises.outstanding`), so a burst of shed clients does not come back as one
  herd.
* A ``Retry-After`` is a promise: a client that comes back when told is recognised by its key
  (the caller's: the tenant and what identifies the request, see the admission plugin) and
  :meth:`Promises.claim` lets it go before the fresh arrivals of its lane. Those fresh arrivals
  count the clients due back before they could start (:meth:`Promises.due`), scaled by the
  share of told clients that lately did come back (:attr:`Promises.return_share`): clients that
  never return do not hold capacity for long.
* One key, one promise: a client told again (back too early, shed again) keeps the newest.
* A promise lives from ``at - early`` to ``at + late`` (:func:`window`); past it the client is
  taken for gone (``expired``). Keyless promises only spread the herd and end at ``at``.
* :meth:`Promises.held` counts an owner's (a tenant's) claimable promises, so that the caller
  can bound them: a tenant shed many times must not come back ahead of everyone else.
* :class:`Stagger` spreads the promises cut to a scale-up (``Gates.promise``): the clients
  shed while one replica loads are told one second apart after it should serve, not all the
  same instant.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import math
from collections.abc import Hashable
from dataclasses import dataclass

__all__ = ["Promises", "Stagger", "window"]

EARLY_S, EARLY_SHARE = 0.05, 0.02  # a client may come back this early (clock skew, rounding)
LATE_S, LATE_SHARE = 1.0, 0.3  # ... and this late (its own jitter, a slow send)
DECAY = 0.98  # weight each return (or no-show) keeps per later one, for ``return_share``


def window(at: float, wait: float) -> tuple[float, float]:
    """(earliest, latest) time a client told ``wait`` seconds, due back at ``at``, may claim."""
    return at - (EARLY_S + EARLY_SHARE * wait), at + max(LATE_S, LATE_SHARE * wait)


@dataclass(slots=True, eq=False)
class _Promise:
    at: float
    early: float
    until: float
    key: Hashable | None
    owner: str | None = None
    live: bool = True


class Promises:
    """Return times promised (through ``Retry-After``) and not yet kept or given up (at most
    ``cap`` live: past it the earliest are forgotten, which only shortens later answers)."""

    def __init__(self, cap: int = 65_536) -> None:
        self.cap = cap
        self._by_at: list[tuple[float, int, _Promise]] = []  # sorted; dead ones skipped
        self._by_until: list[tuple[float, int, _Promise]] = []  # heap; dead ones skipped
        self._by_key: dict[Hashable, list[_Promise]] = {}
        self._held: collections.Counter[str] = collections.Counter()  # owner → keyed, live
        self._live = 0
        self._seq = 0
        self.claimed = 0  # clients that came back as told (cumulative)
        self.expired = 0  # keyed promises nobody came back for (cumulative)
        self._back = 1.0  # decayed counts of returns and no-shows (an optimistic prior)
        self._gone = 0.0

    @property
    def return_share(self) -> float:
        """The share of told clients that lately came back in their window (decayed)."""
        return self._back / (self._back + self._gone)

    def held(self, owner: str) -> int:
        """Claimable promises ``owner`` holds now."""
        return self._held.get(owner, 0)

    def add(
        self, at: float, wait: float = 0.0, key: Hashable | None = None, owner: str | None = None
    ) -> None:
        """A client told to come back at ``at`` (``wait`` seconds from now); with a ``key`` it
        may claim its place (:meth:`claim`), counted against ``owner``."""
        if key is not None:  # one client, one place: the newest answer stands
            for old in self._by_key.get(key, ())[:]:
                self._kill(old)
        early, until = window(at, wait) if key is not None else (at, at)
        p = _Promise(at, early, until, key, owner if key is not None else None)
        if p.owner is not None:
            self._held[p.owner] += 1
        self._seq += 1
        bisect.insort(self._by_at, (at, self._seq, p))
        heapq.heappush(self._by_until, (until, self._seq, p))
        if key is not None:
            self._by_key.setdefault(key, []).append(p)
        self._live += 1
        while self._live > self.cap:
            first = next(e[2] for e in self._by_at if e[2].live)
            self._kill(first)

    def outstanding(self, now: float) -> int:
        """Clients told to come back after ``now`` (one late, or gone for good, no longer
        pushes later answers back)."""
        late = self.due(now, now)  # (expires first: ``_live`` is read after)
        return self._live - late

    def due(self, now: float, by: float) -> int:
        """Clients that may still come back and are due at or before ``by``."""
        self._expire(now)
        n = 0
        for at, _, p in self._by_at:
            if at > by:
                break
            n += p.live
        return n

    def knows(self, key: Hashable) -> bool:
        """Whether ``key`` holds a live promise (in its window or not yet): a request with it is
        that client again (back early, or on time), not a new one."""
        return key in self._by_key

    def claimable(self, now: float, key: Hashable) -> bool:
        """Whether :meth:`claim` would keep a promise for ``key`` now (nothing changes)."""
        return any(p.early <= now <= p.until for p in self._by_key.get(key, ()))

    def window_of(self, key: Hashable) -> tuple[float, float] | None:
        """(earliest, latest) claim time of the newest live promise for ``key`` (None: none):
        what another filter process is told, to recognise the client there
        (:mod:`filters.plugins.admission.shared`)."""
        mine = self._by_key.get(key)
        if not mine:
            return None
        p = max(mine, key=lambda p: p.at)
        return p.early, p.until

    def claim(self, now: float, key: Hashable) -> bool:
        """A client with ``key`` is here: True (and the promise is kept) when it was told to
        come back about now; a client early or never told is fresh."""
        self._expire(now)
        mine = self._by_key.get(key)
        if not mine:
            return False
        ready = [p for p in mine if p.early <= now]
        if not ready:
            return False
        self._kept(min(ready, key=lambda p: p.at))
        return True

    def kept_elsewhere(self, now: float, key: Hashable) -> bool:
        """Another filter process kept ``key``'s promise (:mod:`filters.plugins.admission.shared`): it
        is no longer due here, nor claimable, and it counts as a client that came back."""
        self._expire(now)
        mine = self._by_key.get(key)
        if not mine:
            return False
        self._kept(min(mine, key=lambda p: p.at))
        return True

    def _kept(self, p: _Promise) -> None:
        self._kill(p)
        self.claimed += 1
        self._back = self._back * DECAY + 1.0
        self._gone *= DECAY

    def _kill(self, p: _Promise) -> None:
        p.live = False
        self._live -= 1
        if p.owner is not None:
            self._held[p.owner] -= 1
            if not self._held[p.owner]:
                del self._held[p.owner]
        if p.key is not None:
            mine = self._by_key[p.key]
            mine.remove(p)
            if not mine:
                del self._by_key[p.key]
        if len(self._by_at) > 2 * self._live + 64:  # compact what was skipped
            self._by_at = [e for e in self._by_at if e[2].live]
            self._by_until = [e for e in self._by_until if e[2].live]
            heapq.heapify(self._by_until)

    def _expire(self, now: float) -> None:
        while self._by_until and (self._by_until[0][0] < now or not self._by_until[0][2].live):
            p = heapq.heappop(self._by_until)[2]  # (re-read: a kill may compact the heap)
            if p.live:
                self._kill(p)
                if p.key is not None:
                    self.expired += 1
                    self._gone = self._gone * DECAY + 1.0
                    self._back *= DECAY
        a = self._by_at
        i = 0
        while i < len(a) and not a[i][2].live:
            i += 1
        if i:
            del a[:i]


class Stagger:
    """Per pool, the clients told to come back when a starting replica should serve: the k-th
    told while the same replica loads (same ``ready_at``) gets ``k mod ⌊width⌋`` seconds more
    (``Retry-After`` has whole seconds), so they come back one second apart, not as one herd."""

    def __init__(self) -> None:
        self._told: dict[str, tuple[float, int]] = {}  # pool → (ready_at, told so far)

    def offset(self, pool: str, ready_at: float, width: float) -> float:
        """Seconds to add to this client's promise; ``width`` is how far past ``ready_at`` it
        may be told (0 or less: none)."""
        at, told = self._told.get(pool, (ready_at, 0))
        if abs(at - ready_at) > 0.5:  # another replica loading: start over
            told = 0
        self._told[pool] = (ready_at, told + 1)
        slots = math.floor(width)
        return float(told % slots) if slots >= 1 else 0.0
