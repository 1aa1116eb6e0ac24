"""Prefill coalescing: a prompt sent to a replica that is prefilling the same new prefix right
now waits for that prefill to be stored, instead of prefilling it a second time beside it.

Two requests that start a new document (a new conversation over a shared text, agents fanned
out on one prompt) within one prefill of each other both miss the cache: the second is admitted
while the first is still being computed, and the replica computes the text twice. SGLang's
radix cache has the first's blocks only once its prefill ends (chunk by chunk). So the picker
remembers, per replica and prompt checkpoint, the request that is prefilling it (a **lead**: a
request sent with at least ``min_prefix_tokens`` to prefill), and a later request that the
picker sends to the same replica for a prefix that is pending there but not yet in the index
waits, at most until the lead's deadline, for one of:

* the index shows the replica holding the prefix (``indexed``: exact, once the mapper has
  hashed the lead's text, which it does off the request path right after the lead's pick);
* while the mapper lags, the replica's KV events have stored ``STORED_SHARE`` of the tokens
  that were waiting to be prefilled there when the lead was sent, its own included
  (``Lead.target``, from the picker's prefill backlog; SGLang prefills in arrival order within a
  priority). The share is below 1 because the events count fewer tokens than that estimate (a
  prompt's tokens are estimated from its bytes until mapped, and the backlog of requests whose
  prefill was partly cached stays high until they end). In process (bench/routing_sim.py,
  mapper 0.2 s behind, 12 seeds) a share of 1 made followers wait for most of the lead's
  answer (p99 TTFT up to 71 ms vs 34 without waiting), 0.3–0.5 still up to 55; 0.1–0.2
  released them about when its prefill ended (p99 at most 26) with the same hits;
* the lead's request ended (its stream closed: answered, failed or abandoned).

A lead holds nobody past ``sent + coalesce_wait``: no request waits longer than that, and a
prefill longer than it (a very long prompt) is joined part-way (the chunks already stored are
hits). Waiting costs the follower at most what prefilling beside the lead would have (the two
would share the replica's prefill steps), and the replica computes the text once.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

__all__ = ["Lead", "Leads", "Wait", "follow"]

POLL_S = 0.005  # how often a waiting request looks at the index and the stored tokens
STORED_SHARE = 0.2  # of the backlog up to the lead, stored: its prefill is taken as done


@dataclass(slots=True, eq=False)
class Lead:
    """One request prefilling a new prefix on ``replica``."""

    replica: str
    target: int  # the replica's stored-token count once it (and what was queued before it) is in
    until: float  # clock: nobody waits on it past this
    done: bool = False  # its request ended


@dataclass(frozen=True, slots=True)
class Wait:
    """What a request waits for: ``lead``'s prefill of its first ``marks`` checkpoints."""

    lead: Lead
    marks: int


class Leads:
    """Per checkpoint digest and replica: the lead that last sent it there (bounded, LRU)."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max(1, max_entries)
        self._by: collections.OrderedDict[bytes, dict[str, Lead]] = collections.OrderedDict()

    def add(self, lead: Lead, marks: Sequence[bytes]) -> None:
        for mark in marks:
            self._by.setdefault(mark, {})[lead.replica] = lead
            self._by.move_to_end(mark)
        while len(self._by) > self.max_entries:
            self._by.popitem(last=False)

    def get(self, replica: str, mark: bytes, now: float) -> Lead | None:
        """The lead prefilling ``mark`` on ``replica`` now (None: none, ended, or too old)."""
        lead = self._by.get(mark, {}).get(replica)
        return lead if lead is not None and _active(lead, now) else None

    def runs(self, marks: Sequence[bytes], now: float) -> dict[str, Wait]:
        """Per replica where the prompt's first checkpoints are being prefilled now: how many
        in a row, and the lead of the last of them."""
        out: dict[str, Wait] = {}
        alive: dict[str, Lead] | None = None
        for k, mark in enumerate(marks, start=1):
            here = self._by.get(mark)
            if not here:
                break
            now_alive = {n: lead for n, lead in here.items() if _active(lead, now)}
            alive = (
                now_alive if alive is None else {n: v for n, v in now_alive.items() if n in alive}
            )
            if not alive:
                break
            for name, lead in alive.items():
                out[name] = Wait(lead, k)
        return out

    def __len__(self) -> int:
        return len(self._by)


def _active(lead: Lead, now: float) -> bool:
    return not lead.done and lead.until > now


async def follow(
    lead: Lead,
    stored: Callable[[], int],
    clock: Callable[[], float],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    indexed: Callable[[], bool] = lambda: False,
) -> str:
    """Wait for ``lead``'s prefill. The outcome: ``indexed`` (``indexed()``: the index shows the
    replica holds the prefix), ``stored`` (``stored()``, the replica's stored-token count, reached
    the lead's target), ``ended`` (the lead's request ended first) or ``timed_out`` (its
    deadline came first)."""
    while True:
        if indexed():
            return "indexed"
        if stored() >= lead.target:
            return "stored"
        if lead.done:
            return "ended"
        left = lead.until - clock()
        if left <= 0:
            return "timed_out"
        await sleep(min(POLL_S, left))
