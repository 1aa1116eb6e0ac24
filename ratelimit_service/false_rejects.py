"""False rejects: 429s whose tenant had room after all, once its requests in flight settled.

A reservation holds what a request *may* use; its settlement returns what it did not. A token
429 refused a request for ``shortfall`` tokens (what it asked minus what the limit held); if the
tenant's settlements in the next ``horizon`` seconds refund at least that much, the request
would have fit had the reservations in flight been their real costs: a false reject, the price
of reserving before the answer is known (the smaller the reservations, the fewer: docs/quotas.md
"Reservations that fit the answer"). Counted per tenant in
``tokenweir_ratelimit_false_rejects_total``.

Approximate by design, and cheap (a deque per tenant with open 429s): refunds of requests
reserved after the 429 count too (over), and with several rate-limit replicas each sees the
settlements that reach it (under: Envoy sends a stream's settle to any replica). Pure: no
clock, no I/O.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = ["FalseRejects"]


@dataclass(slots=True)
class _Open:
    at: float
    shortfall: float
    refunded: float = 0.0


class FalseRejects:
    def __init__(self, *, horizon: float = 60.0, max_open: int = 10_000) -> None:
        self.horizon = horizon
        self.max_open = max_open
        self._open: dict[str, deque[_Open]] = {}
        self._count = 0

    def rejected(self, tenant: str, now: float, shortfall: float) -> None:
        """A token 429 for ``tenant`` that lacked ``shortfall`` tokens."""
        if shortfall <= 0:
            return
        q = self._open.get(tenant)
        if q is None:
            if self._count >= self.max_open:
                self.expire(now)
                if self._count >= self.max_open:
                    return  # too many open at once: these are not followed
            q = self._open[tenant] = deque()
        q.append(_Open(now, shortfall))
        self._count += 1

    def refunded(self, tenant: str, now: float, tokens: float) -> int:
        """``tenant``'s settlements returned ``tokens``; how many of its open 429s that makes
        false rejects (each is counted once, then forgotten)."""
        q = self._open.get(tenant)
        if q is None or tokens <= 0:
            return 0
        self._drop_old(tenant, q, now)
        false = 0
        for o in list(q):
            o.refunded += tokens
            if o.refunded >= o.shortfall:
                q.remove(o)
                self._count -= 1
                false += 1
        if not q:
            del self._open[tenant]
        return false

    def expire(self, now: float) -> None:
        for tenant, q in list(self._open.items()):
            self._drop_old(tenant, q, now)
            if not q:
                del self._open[tenant]

    def _drop_old(self, tenant: str, q: deque[_Open], now: float) -> None:
        while q and q[0].at < now - self.horizon:
            q.popleft()
            self._count -= 1
