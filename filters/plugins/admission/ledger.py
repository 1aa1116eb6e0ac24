"""Virtual token counters: who of a lane's tenants goes next, by the tokens each was served.

A lane's tenants share its capacity in proportion to their weights measured in **tokens**, not
requests (VTC, Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024): a tenant
whose answers are ten times longer gets a tenth of the requests. Each tenant's virtual time is

    vtime = (settled + in_flight) / weight + lift

- ``settled``: the tokens (prompt + completion) its finished requests were served, as the usage
  meter settles them — in this filter process, and, where admission is split over several,
  in every other one too (:mod:`filters.plugins.admission.fairshare` adds theirs through Redis);
- ``in_flight``: what this process's running requests of the tenant are expected to cost (its
  recent settled tokens per request, else the lane's, else the request's own size), so a burst
  is not all given to one tenant before any of its requests settles;
- ``lift``: a tenant that (re)joins a lane whose backlogged tenants are ahead of it is lifted to
  the least of them: idleness banks no credit (VTC's counter lift).

The queue serves the backlogged tenant with the least virtual time (:mod:`.queues`). Pure: no
clock, no I/O; ``window`` snapshots (taken by the caller's clock) give the fairness gauges —
Jain's index over the tenants that were backlogged, and the largest service gap between two
of them, both in weighted settled tokens.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["DEFAULT_COST", "SETTLE_WAIT", "Fairness", "TokenLedger"]

DEFAULT_COST = 256  # tokens a request is expected to cost before anything has settled
_ALPHA = 0.2  # the weight of the newest request in a tenant's cost per request
_MAX_TENANTS = 4096  # idle tenants forgotten past this many (oldest first)
# how long an ended request's charge stands in for its usage: Envoy's access log (the Lua
# meter's usage) arrives about a second after the stream ends (its flush interval), through
# another filter process half a second later (fairshare.SYNC_S)
SETTLE_WAIT = 2.0


@dataclass(slots=True)
class _Account:
    weight: float = 1.0
    settled: float = 0.0
    in_flight: float = 0.0
    lift: float = 0.0
    cost: float | None = None  # settled tokens per request, smoothed (None: none settled yet)
    running: int = 0
    # charges of ended requests whose settlement has not arrived yet: (expires, charge)
    unsettled: deque[tuple[float, float]] = field(default_factory=deque)
    standing: float = 0.0  # the sum of the charges in ``unsettled``


@dataclass(frozen=True, slots=True)
class Fairness:
    """How fairly a lane served its backlogged tenants over a window."""

    tenants: int  # tenants backlogged in the window
    jain: float  # Jain's index of their weighted settled tokens (1: equal shares)
    gap: float  # the largest difference between two of them, weighted tokens


class TokenLedger:
    """One lane's virtual token counters (in one filter process)."""

    def __init__(self) -> None:
        self._accounts: OrderedDict[str, _Account] = OrderedDict()
        self._lane_cost: float | None = None
        self._backlogged: set[str] = set()  # tenants with queued requests since the last snapshot
        self._snaps: deque[tuple[float, dict[str, float], frozenset[str]]] = deque()
        self._waiting: set[str] = set()  # tenants with unsettled charges
        # tokens and requests settled here since the last take_pending (for the other processes)
        self._pending: dict[str, tuple[float, int]] = {}

    def _account(self, tenant: str) -> _Account:
        a = self._accounts.get(tenant)
        if a is None:
            a = self._accounts[tenant] = _Account()
            if len(self._accounts) > _MAX_TENANTS:
                self._forget()
        else:
            self._accounts.move_to_end(tenant)
        return a

    def _forget(self) -> None:
        for name in list(self._accounts):
            if len(self._accounts) <= _MAX_TENANTS:
                return
            a = self._accounts[name]
            if a.running == 0 and not a.unsettled and name not in self._backlogged:
                del self._accounts[name]

    def vtime(self, tenant: str) -> float:
        a = self._accounts.get(tenant)
        if a is None:
            return 0.0
        return (a.settled + a.in_flight + a.standing) / a.weight + a.lift

    def join(self, tenant: str, weight: float, floor: float) -> None:
        """``tenant`` has a request queued again: not behind ``floor`` (the least virtual time
        of the lane's backlogged tenants, or the last one served's)."""
        a = self._account(tenant)
        a.weight = weight
        self._backlogged.add(tenant)
        behind = floor - self.vtime(tenant)
        if behind > 0:
            a.lift += behind

    def expected(self, tenant: str, size: int = 0) -> float:
        """What a request of ``tenant`` is expected to cost, in tokens."""
        a = self._accounts.get(tenant)
        if a is not None and a.cost is not None:
            return a.cost
        if self._lane_cost is not None:
            return self._lane_cost
        return float(size) if size > 0 else float(DEFAULT_COST)

    def start(self, tenant: str, weight: float, size: int = 0) -> float:
        """A request of ``tenant`` starts; returns what it was charged (give it to ``end``)."""
        a = self._account(tenant)
        a.weight = weight
        charge = self.expected(tenant, size)
        a.in_flight += charge
        a.running += 1
        return charge

    def end(self, tenant: str, charge: float, now: float, tokens: float | None = None) -> None:
        """A request that ``start`` charged ``charge`` ended: ``tokens`` is its settled usage
        when known now; otherwise its charge stands in for ``SETTLE_WAIT`` s, until its usage
        has had time to arrive through :meth:`settle` (Envoy's access log, here or at another
        filter process), so a tenant does not look cheap between the two."""
        a = self._accounts.get(tenant)
        if a is None:
            return
        a.in_flight = max(0.0, a.in_flight - charge)
        a.running = max(0, a.running - 1)
        if tokens is not None:
            self._settled(tenant, a, tokens, local=True)
        else:
            a.unsettled.append((now + SETTLE_WAIT, charge))
            a.standing += charge
            self._waiting.add(tenant)
        self.expire(now)

    def settle(
        self, tenant: str, tokens: float, now: float, *, local: bool = True, requests: int = 1
    ) -> None:
        """``tenant`` was served ``tokens`` by ``requests`` requests (their settled usage, from
        the usage meter); ``local`` False: by other filter processes (:mod:`.fairshare`)."""
        self._settled(tenant, self._account(tenant), tokens, local=local, requests=requests)
        self.expire(now)

    def _settled(
        self, tenant: str, a: _Account, tokens: float, *, local: bool, requests: int = 1
    ) -> None:
        if tokens < 0 or requests < 0:
            return
        a.settled += tokens
        if local:
            t, n = self._pending.get(tenant, (0.0, 0))
            self._pending[tenant] = (t + tokens, n + requests)
        if requests == 0:
            return
        # the cost per request, learned from every process's requests: each of the
        # ``requests`` moves the average by _ALPHA towards their mean
        mean = tokens / requests
        step = 1.0 - (1.0 - _ALPHA) ** requests
        a.cost = mean if a.cost is None else a.cost + step * (mean - a.cost)
        lane = self._lane_cost
        self._lane_cost = mean if lane is None else lane + step * (mean - lane)

    def expire(self, now: float) -> None:
        """Drop the stand-in charges older than ``SETTLE_WAIT``: their usage has arrived by
        now (a stand-in and its usage both count meanwhile: about as long for every tenant,
        so in proportion to what each is being served, which leaves their order as it is)."""
        for name in list(self._waiting):
            a = self._accounts.get(name)
            if a is None:
                self._waiting.discard(name)
                continue
            while a.unsettled and a.unsettled[0][0] <= now:
                a.standing -= a.unsettled.popleft()[1]
            if not a.unsettled:
                a.standing = 0.0  # (no float residue)
                self._waiting.discard(name)

    def take_pending(self) -> dict[str, tuple[float, int]]:
        """The tokens and requests settled in this process since the last call, per tenant."""
        out, self._pending = self._pending, {}
        return out

    def settled(self, tenant: str) -> float:
        a = self._accounts.get(tenant)
        return a.settled if a is not None else 0.0

    # -- the fairness window ---------------------------------------------------------------
    def snapshot(self, now: float, window: float, queued: Iterable[str]) -> Fairness | None:
        """Record the counters at ``now`` (``queued``: the tenants with requests queued now);
        the fairness of the last ``window`` seconds among the tenants backlogged in it (None:
        fewer than two were, or there is no older snapshot)."""
        self.expire(now)
        waiting = set(queued)
        served = {name: a.settled / a.weight for name, a in self._accounts.items()}
        self._snaps.append((now, served, frozenset(self._backlogged | waiting)))
        self._backlogged = waiting
        while len(self._snaps) > 1 and self._snaps[1][0] <= now - window:
            self._snaps.popleft()
        first_t, first, _ = self._snaps[0]
        if first_t >= now:
            return None
        seen: set[str] = set()
        for _, _, backlogged in self._snaps:
            seen |= backlogged
        shares = [served.get(n, 0.0) - first.get(n, 0.0) for n in seen]
        if len(shares) < 2:
            return None
        total = sum(shares)
        squares = sum(x * x for x in shares)
        jain = total * total / (len(shares) * squares) if squares > 0 else 1.0
        return Fairness(len(shares), jain, max(shares) - min(shares))
