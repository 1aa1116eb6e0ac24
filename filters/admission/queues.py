"""One lane's queue: a FIFO per tenant, served by weighted fair queueing (start-time fair).

Each tenant has a virtual time that advances by ``1 / weight`` per request served; the tenant
with the smallest virtual time goes next (ties: the oldest head). A tenant that was idle joins
at the lane's current virtual time, so idleness banks no credit. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

__all__ = ["LaneQueue", "Ticket"]


@dataclass(slots=True, eq=False)
class Ticket:
    """One request's place: queued, then admitted, then done (or dropped)."""

    seq: int
    lane: str
    tenant: str
    weight: float
    tokens: int
    arrived: float
    start_by: float  # the latest time it may start: min(arrived + lane wait, deadline)
    deadline: float | None = None  # the client's own deadline (same clock), if it sent one
    state: str = "queued"  # queued | admitted | done | dropped
    granted_at: float = 0.0  # when it was admitted (same clock)


@dataclass(slots=True)
class _Tenant:
    queue: deque[Ticket] = field(default_factory=deque)
    vtime: float = 0.0


class LaneQueue:
    """The waiting tickets of one lane, with a bound in total and per tenant."""

    def __init__(self, name: str, bound: int, tenant_bound: int) -> None:
        self.name = name
        self.bound = bound
        self.tenant_bound = tenant_bound
        self._tenants: dict[str, _Tenant] = {}
        self._vclock = 0.0
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def queued(self, tenant: str) -> int:
        t = self._tenants.get(tenant)
        return len(t.queue) if t is not None else 0

    def tenants(self) -> dict[str, int]:
        """Queued requests per tenant (tenants with none are left out)."""
        return {name: len(t.queue) for name, t in self._tenants.items() if t.queue}

    def refusal(self, tenant: str) -> str | None:
        """Why one more ticket of ``tenant`` cannot queue here, or None."""
        if self._len >= self.bound:
            return "queue_full"
        if self.queued(tenant) >= self.tenant_bound:
            return "tenant_queue_full"
        return None

    def push(self, ticket: Ticket) -> None:
        t = self._tenants.get(ticket.tenant)
        if t is None:
            t = self._tenants[ticket.tenant] = _Tenant()
        if not t.queue:  # (re)joining: no credit for the time it was idle
            t.vtime = max(t.vtime, self._vclock)
        t.queue.append(ticket)
        self._len += 1

    def peek(self) -> Ticket | None:
        """The ticket weighted fairness serves next."""
        best: _Tenant | None = None
        for t in self._tenants.values():
            if not t.queue:
                continue
            if (
                best is None
                or t.vtime < best.vtime
                or (t.vtime == best.vtime and t.queue[0].seq < best.queue[0].seq)
            ):
                best = t
        return best.queue[0] if best is not None else None

    def pop(self) -> Ticket:
        ticket = self.peek()
        if ticket is None:
            raise IndexError("pop from an empty lane queue")
        t = self._tenants[ticket.tenant]
        t.queue.popleft()
        self._len -= 1
        self._vclock = t.vtime
        t.vtime += 1.0 / ticket.weight
        if not t.queue:  # forget idle tenants (their debt is at most one request)
            del self._tenants[ticket.tenant]
        return ticket

    def remove(self, ticket: Ticket) -> bool:
        """Take a ticket out wherever it is (abort, timeout); False if it was not queued."""
        t = self._tenants.get(ticket.tenant)
        if t is None:
            return False
        try:
            t.queue.remove(ticket)
        except ValueError:
            return False
        self._len -= 1
        if not t.queue:
            del self._tenants[ticket.tenant]
        return True

    def ahead_of_new(self, tenant: str, weight: float) -> int:
        """How many queued tickets weighted fairness would serve before a new one of
        ``tenant``: from each tenant, about its weighted share of the newcomer's position."""
        mine = self.queued(tenant)
        total = mine
        for name, t in self._tenants.items():
            if name == tenant or not t.queue:
                continue
            share = math.ceil((mine + 1) * t.queue[0].weight / weight)
            total += min(len(t.queue), share)
        return total

    def ranked(self) -> list[tuple[Ticket, int]]:
        """Every queued ticket with about how many of this lane weighted fairness serves before
        it (the same estimate as :meth:`ahead_of_new` gave it when it joined), fewest first."""
        heads = [(len(t.queue), t.queue[0].weight) for t in self._tenants.values() if t.queue]
        out = []
        for t in self._tenants.values():
            if not t.queue:
                continue
            mine = len(t.queue)
            w = t.queue[0].weight
            for i, ticket in enumerate(t.queue):
                others = sum(min(n, math.ceil((i + 1) * wo / w)) for n, wo in heads)
                others -= min(mine, i + 1)  # its own tenant, counted in heads
                out.append((ticket, i + others))
        out.sort(key=lambda x: (x[1], x[0].seq))
        return out

    def all(self) -> list[Ticket]:
        return [x for t in self._tenants.values() for x in t.queue]
