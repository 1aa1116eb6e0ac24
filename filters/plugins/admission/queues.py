"""One lane's queue: a FIFO per tenant, served by weighted fair queueing in tokens.

Each tenant has a virtual time that advances by the tokens it is served over its weight
(:class:`~filters.plugins.admission.ledger.TokenLedger`: virtual token counters); the tenant with the
smallest virtual time goes next (ties: the oldest head). A tenant that was idle joins at the
virtual time the last one served had when it started (start-time fair queueing), so idleness
banks no credit. Clients that come back when a
``Retry-After`` told them (``Ticket.returning``) wait in a FIFO of their own that is served
first: their place was taken when they were shed (their tenant's virtual time is charged when
one starts). Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

from filters.plugins.admission.ledger import TokenLedger

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
    key: Hashable | None = None  # what recognises its client when it comes back (Retry-After)
    returning: bool = False  # it came back when a Retry-After told it: served first
    charge: float = 0.0  # the tokens its tenant's virtual counter was charged at its start
    valley: bool = False  # a batch runner's line (poolstate/valley.py): not the ladder's demand


@dataclass(slots=True)
class _Tenant:
    queue: deque[Ticket] = field(default_factory=deque)


class LaneQueue:
    """The waiting tickets of one lane, with a bound in total and per tenant."""

    def __init__(self, name: str, bound: int, tenant_bound: int) -> None:
        self.name = name
        self.bound = bound
        self.tenant_bound = tenant_bound
        self._tenants: dict[str, _Tenant] = {}
        self._front: deque[Ticket] = deque()  # returning clients, served first
        self._vclock = 0.0  # the virtual time the tenant served last had at its start
        self._len = 0
        self.ledger = TokenLedger()

    def __len__(self) -> int:
        return self._len

    @property
    def returning(self) -> int:
        """Returning clients queued (all before every fresh ticket)."""
        return len(self._front)

    def queued(self, tenant: str) -> int:
        t = self._tenants.get(tenant)
        back = sum(1 for x in self._front if x.tenant == tenant) if self._front else 0
        return (len(t.queue) if t is not None else 0) + back

    def tenants(self) -> dict[str, int]:
        """Queued requests per tenant (tenants with none are left out)."""
        out = {name: len(t.queue) for name, t in self._tenants.items() if t.queue}
        for x in self._front:
            out[x.tenant] = out.get(x.tenant, 0) + 1
        return out

    def refusal(self, tenant: str, *, returning: bool = False) -> str | None:
        """Why one more ticket of ``tenant`` cannot queue here, or None. A returning client
        was promised its place: the lane's bound does not turn it away (its tenant's does)."""
        if self._len >= self.bound and not returning:
            return "queue_full"
        if self.queued(tenant) >= self.tenant_bound:
            return "tenant_queue_full"
        return None

    def push(self, ticket: Ticket) -> None:
        if ticket.returning:
            self._front.append(ticket)
            self._len += 1
            return
        t = self._tenants.get(ticket.tenant)
        if t is None:
            t = self._tenants[ticket.tenant] = _Tenant()
        if not t.queue:  # (re)joining: no credit for the time it was idle
            self.ledger.join(ticket.tenant, ticket.weight, self._vclock)
        t.queue.append(ticket)
        self._len += 1

    def peek(self) -> Ticket | None:
        """The ticket served next: the first returning client, else weighted fairness's."""
        if self._front:
            return self._front[0]
        best: _Tenant | None = None
        best_v = 0.0
        vtime = self.ledger.vtime
        for name, t in self._tenants.items():
            if not t.queue:
                continue
            v = vtime(name)
            if best is None or v < best_v or (v == best_v and t.queue[0].seq < best.queue[0].seq):
                best, best_v = t, v
        return best.queue[0] if best is not None else None

    def pop(self) -> Ticket:
        ticket = self.peek()
        if ticket is None:
            raise IndexError("pop from an empty lane queue")
        if self._front:
            self._front.popleft()
            self._len -= 1  # (its start is charged to its tenant's counter like any other)
            return ticket
        t = self._tenants[ticket.tenant]
        t.queue.popleft()
        self._len -= 1
        self._vclock = self.ledger.vtime(ticket.tenant)
        if not t.queue:  # its counter stays in the ledger; the queue forgets it
            del self._tenants[ticket.tenant]
        return ticket

    def remove(self, ticket: Ticket) -> bool:
        """Take a ticket out wherever it is (abort, timeout); False if it was not queued."""
        if ticket.returning:
            try:
                self._front.remove(ticket)
            except ValueError:
                return False
            self._len -= 1
            return True
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
        ``tenant``: every returning client, and from each tenant about its weighted share of
        the newcomer's position."""
        t0 = self._tenants.get(tenant)
        mine = len(t0.queue) if t0 is not None else 0
        total = mine + len(self._front)
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
        first = len(self._front)
        out = [(ticket, i) for i, ticket in enumerate(self._front)]
        for t in self._tenants.values():
            if not t.queue:
                continue
            mine = len(t.queue)
            w = t.queue[0].weight
            for i, ticket in enumerate(t.queue):
                others = sum(min(n, math.ceil((i + 1) * wo / w)) for n, wo in heads)
                others -= min(mine, i + 1)  # its own tenant, counted in heads
                out.append((ticket, first + i + others))
        out.sort(key=lambda x: (x[1], x[0].seq))
        return out

    def all(self) -> list[Ticket]:
        return [*self._front, *(x for t in self._tenants.values() for x in t.queue)]
