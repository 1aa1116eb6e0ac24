"""What a replica spent from its local buckets while Redis was down, to charge into Redis after.

Without Redis the rate-limit service decides from local buckets (``failure_mode: open``, each
replica a 1/replicas share of every limit) and settles those reservations locally. When Redis
answers again, what was spent meanwhile is charged there too (:meth:`Decider.reconcile
<ratelimit_service.decider.Decider>`), so the outage does not hand every tenant a fresh budget on
top of what it used: per (tenant, model, lane), the tokens and micro-USD its requests were
served (the local reservations, corrected by their local settlements).

A subject is charged once none of its local reservations is still open (settled, or older than
the reservation TTL: such a stream's record is lost, its reservation stands as its cost), so a
charge is never followed by a refund. A call that timed out but was applied in Redis before the
outage began is counted both there and here: the tenant is charged a little more, never less.
Pure: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quota.config import Limit

__all__ = ["OutageLedger", "Spent"]

Key = tuple[str, str | None, str | None]  # subject, model, lane


@dataclass(slots=True)
class Spent:
    """One subject's spending while Redis was down."""

    subject: str
    model: str | None
    lane: str | None
    limits: list[Limit]  # the subject's limits (unscaled: Redis holds the whole limit)
    tokens: int = 0
    usd: int = 0
    open: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # record → (at, tok, usd)


class OutageLedger:
    def __init__(self, ttl_us: int) -> None:
        self.ttl_us = ttl_us
        self._spent: dict[Key, Spent] = {}
        self._records: dict[str, Key] = {}

    def __len__(self) -> int:
        return len(self._spent)

    def reserved(
        self, record: str, key: Key, limits: list[Limit], tokens: int, usd: int, now_us: int
    ) -> None:
        """A local reservation of ``tokens`` (and ``usd``) was admitted under ``record``."""
        s = self._spent.get(key)
        if s is None:
            s = self._spent[key] = Spent(key[0], key[1], key[2], limits)
        s.limits = limits
        s.tokens += tokens
        s.usd += usd
        s.open[record] = (now_us, tokens, usd)
        self._records[record] = key

    def settled(self, record: str, actual_tokens: int, actual_usd: int) -> None:
        """``record``'s local settlement: its real cost replaces its reservation."""
        key = self._records.pop(record, None)
        s = self._spent.get(key) if key is not None else None
        if s is None:
            return
        opened = s.open.pop(record, None)
        if opened is None:
            return
        _, tokens, usd = opened
        s.tokens += actual_tokens - tokens
        s.usd += actual_usd - usd

    def due(self, now_us: int) -> list[Spent]:
        """The subjects ready to charge (no local reservation open, or only ones past the TTL),
        taken out of the ledger."""
        out: list[Spent] = []
        for key, s in list(self._spent.items()):
            for record, (at, _, _) in list(s.open.items()):
                if now_us - at > self.ttl_us:  # lost: its reservation stands as its cost
                    del s.open[record]
                    self._records.pop(record, None)
            if not s.open:
                del self._spent[key]
                out.append(s)
        return out

    def put_back(self, s: Spent) -> None:
        """A charge that could not be made (Redis failed again): kept for the next try."""
        key = (s.subject, s.model, s.lane)
        have = self._spent.get(key)
        if have is None:
            self._spent[key] = s
            return
        have.tokens += s.tokens
        have.usd += s.usd
