"""The prefix index: block-hash chains → the replicas that hold them (pure: no I/O, no clock).

Fed by each replica's KV-event stream (``apply``), asked for a prompt (``query``): per replica,
how many leading tokens of the prompt it has cached, or ``None`` (unknown). Guarantees:

- **Exact when nothing is lost**: a replica's block set is the set of page hashes in its radix
  tree, so the answer is the tree's longest cached prefix (whole pages). A block hash names the
  whole prefix up to its page (hashes chain), so a walk over the prompt's hashes is a tree walk.
- **Unknown, never wrong**: a replica is *known* only while its events form one unbroken
  sequence from a baseline (an ``AllBlocksCleared``: a fresh cache, a flush) up to the highest
  sequence number seen on its live stream, and it was heard from within ``stale_after_s``. A gap
  (seq jump), a restart (seq going back on the live stream) or silence makes it unknown; a replay
  that fills the gap, or a new ``AllBlocksCleared``, makes it known again.
- **Bounded memory**: at most ``max_blocks`` block hashes per replica (a replica's radix tree
  bounds it already: its capacity in pages; the bound guards against a stream that never removes).
  Past it, arbitrary blocks of that replica are dropped. Dropping only ever *lowers* an answer
  (the walk stops at a missing block), it never raises one.
- **Cheap to feed**: each replica's blocks are one ``set``; a batch is applied with set updates
  at C speed (page size 1 means one hash per token: a 30k-token prompt is one 30k-hash event),
  and a query walks each known replica's set only as far as its run of held blocks goes.
- **Anchors** (``anchor_every`` = 2**k > 1): only *anchor* blocks are kept, those whose hash has
  its low k bits zero (:func:`prefixindex.wire.is_anchor`; SHA-256 makes that one block
  in 2**k, spread evenly). A radix tree that holds a page holds every page before it, so the
  answer is the longest cached prefix *rounded down to its last anchor*: exact at anchor
  granularity, lower by less than ``anchor_every`` pages on average, never higher. With
  ``anchor_every`` 16 at page size 1, a 3k-token prompt's events touch ~190 set entries instead of
  ~3,000 (stored, then the same again when evicted) — the index's main cost on a busy pool.

Block hashing must match the backend's: ``page_size`` and the token ids of the pool's tokenizer
(``prefixindex.hashing``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from prefixindex.hashing import prefix_block_ids
from prefixindex.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    IndexBatch,
    KVEventBatch,
    RemovedBlocks,
    StoredBlocks,
    anchor_mask,
    keep_anchors,
)

__all__ = ["Applied", "PrefixIndex", "ReplicaView"]


class Applied(Enum):
    """What ``apply`` did with one batch."""

    APPLIED = "applied"  # in sequence (or a baseline): the replica's blocks follow it
    DUPLICATE = "duplicate"  # already applied (a replay overlapping what came live)
    NEEDS_RESYNC = "needs_resync"  # not applied: ask the replay socket from ``resync_from``


@dataclass(slots=True)
class _Replica:
    blocks: set[int] = field(default_factory=set)
    last_seq: int | None = None  # last batch applied in sequence since a baseline
    highest_seen: int = -1  # highest seq seen, live or replayed
    live_seen: int = -1  # highest seq seen on the live stream (a restart sends it back)
    last_heard: float | None = None
    last_ts: float | None = None  # the publisher's timestamp of the last batch applied
    reason: str = "no baseline yet"  # why unknown (when it is)
    restarts: int = 0
    gaps: int = 0
    stored_tokens: int = 0  # tokens its applied events stored, ever (never reset: a counter)


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """One replica's state, for metrics and debugging."""

    name: str
    known: bool
    reason: str  # "" when known
    blocks: int
    last_seq: int | None
    highest_seen: int
    last_ts: float | None
    restarts: int
    gaps: int


class PrefixIndex:
    """Which replicas hold which block-hash chains; see the module docstring for guarantees."""

    def __init__(
        self,
        page_size: int,
        *,
        max_blocks: int = 1_000_000,
        stale_after_s: float = 30.0,
        anchor_every: int = 1,
    ) -> None:
        if page_size <= 0 or max_blocks <= 0 or stale_after_s <= 0:
            raise ValueError("page_size, max_blocks and stale_after_s must be > 0")
        self.page_size = page_size
        self.anchor_every = anchor_every
        self._mask = anchor_mask(anchor_every)
        self.max_blocks = max_blocks
        self.stale_after_s = stale_after_s
        self._replicas: dict[str, _Replica] = {}
        self.evicted_blocks = 0  # dropped by the memory bound

    # ---- replicas ----------------------------------------------------------------------------
    def add_replica(self, name: str) -> None:
        if name not in self._replicas:
            self._replicas[name] = _Replica()

    def remove_replica(self, name: str) -> None:
        self._replicas.pop(name, None)

    def replicas(self) -> list[str]:
        return list(self._replicas)

    def forget(self, name: str, reason: str) -> None:
        """Drop what is known of ``name`` (its process restarted, its stream cannot be trusted)."""
        replica = self._replicas[name]
        replica.blocks = set()
        replica.last_seq = None
        replica.highest_seen = -1
        replica.live_seen = -1
        replica.reason = reason

    def heard(self, name: str, now: float) -> None:
        """``name`` answered (a batch, a replay): its stream is not stale at ``now``."""
        self._replicas[name].last_heard = now

    def resync_from(self, name: str) -> int:
        """The sequence number to ask ``name``'s replay socket for."""
        last = self._replicas[name].last_seq
        return 0 if last is None else last + 1

    # ---- events ------------------------------------------------------------------------------
    def apply(
        self, name: str, seq: int, batch: KVEventBatch | IndexBatch, *, live: bool = True
    ) -> Applied:
        """Apply one batch of ``name``'s events, received live (PUB) or from a replay. An
        ``IndexBatch`` must have been decoded for this index's ``anchor_every``."""
        mask = self._mask  # a decoded IndexBatch holds anchors only already
        if isinstance(batch, IndexBatch):
            if batch.anchor_every != self.anchor_every:
                raise ValueError(
                    f"batch decoded for anchor_every {batch.anchor_every}, "
                    f"index has {self.anchor_every}"
                )
            mask = 0
        r = self._replicas[name]
        if live:
            # a live stream never repeats itself: going back means the publisher started again.
            # A live batch at or below ``last_seq`` but above ``live_seen`` is one a replay got
            # first (the probe ran while it sat in the SUB socket): a duplicate, not a restart.
            if seq <= r.live_seen:
                r.restarts += 1
                self.forget(name, "publisher restarted")
            r.live_seen = seq
            r.highest_seen = max(r.highest_seen, seq) if r.last_seq is not None else seq
        clear_at = max(
            (i for i, e in enumerate(batch.events) if isinstance(e, AllBlocksCleared)), default=-1
        )
        if r.last_seq is not None and seq <= r.last_seq:
            return Applied.DUPLICATE
        if clear_at >= 0:
            r.blocks = set()  # a baseline: whatever came before no longer matters
            events = batch.events[clear_at + 1 :]
        elif r.last_seq is not None and seq == r.last_seq + 1:
            events = batch.events
        else:
            if r.last_seq is not None:
                r.gaps += 1
                r.reason = f"gap after seq {r.last_seq} (got {seq})"
            return Applied.NEEDS_RESYNC
        for event in events:
            if isinstance(event, StoredBlocks):
                r.stored_tokens += event.stored * event.block_size
                self._store(r, keep_anchors(event.block_hashes, mask))
            elif isinstance(event, BlockStored):
                r.stored_tokens += len(event.block_hashes) * event.block_size
                self._store(r, keep_anchors(event.block_hashes, mask))
            elif isinstance(event, RemovedBlocks | BlockRemoved):
                self._remove(r, keep_anchors(event.block_hashes, mask))
        r.last_seq, r.last_ts = seq, batch.ts
        r.highest_seen = max(r.highest_seen, seq)
        r.reason = ""
        return Applied.APPLIED

    def _store(self, r: _Replica, hashes: Iterable[int]) -> None:
        blocks = r.blocks
        blocks.update(hashes)
        excess = len(blocks) - self.max_blocks
        if excess > 0:
            self.evicted_blocks += excess
            for _ in range(excess):
                blocks.pop()

    def _remove(self, r: _Replica, hashes: Iterable[int]) -> None:
        r.blocks.difference_update(hashes)

    # ---- questions ---------------------------------------------------------------------------
    def known(self, name: str, now: float) -> bool:
        r = self._replicas[name]
        return self._known(r, now)

    def _known(self, r: _Replica, now: float) -> bool:
        return (
            r.last_seq is not None
            and r.last_seq >= r.highest_seen
            and r.last_heard is not None
            and now - r.last_heard <= self.stale_after_s
        )

    def query(self, token_ids: Sequence[int], now: float) -> dict[str, int | None]:
        """Per replica: leading tokens of ``token_ids`` it has cached (whole pages), or None."""
        return self.query_blocks(prefix_block_ids(token_ids, self.page_size), now)

    def query_blocks(self, block_ids: Sequence[int], now: float) -> dict[str, int | None]:
        """As ``query``, for a prompt already hashed (``prefix_block_ids``: every page)."""
        pages = self._anchor_pages(block_ids)
        runs = self.query_chain([block_ids[i] for i in pages], now)
        return {
            n: None if c is None else (pages[c - 1] + 1) * self.page_size if c else 0
            for n, c in runs.items()
        }

    def anchored(self, block_ids: Sequence[int], tokens: int) -> int:
        """What this index can answer for a cached prefix of ``tokens`` tokens of a prompt
        whose pages hash to ``block_ids``: the tokens up to its last anchor page."""
        whole = min(tokens // self.page_size, len(block_ids))
        pages = self._anchor_pages(block_ids[:whole])
        return (pages[-1] + 1) * self.page_size if pages else 0

    def _anchor_pages(self, block_ids: Sequence[int]) -> list[int]:
        mask = self._mask
        return [i for i, h in enumerate(block_ids) if not h & mask]

    def query_chain(self, block_ids: Sequence[int], now: float) -> dict[str, int | None]:
        """Per replica: how many of ``block_ids`` (hashes of *some anchor* pages of one prompt,
        in order, e.g. one per checkpoint) it holds in a row from the first, or None (unknown).

        A radix tree holds every ancestor of a block it holds, so sparse hashes give the match
        at their granularity; a block dropped by the memory bound ends the run (lower, never
        higher).
        """
        out: dict[str, int | None] = {}
        for name, r in self._replicas.items():
            if not self._known(r, now):
                out[name] = None
                continue
            blocks, count = r.blocks, 0
            for h in block_ids:
                if h not in blocks:
                    break
                count += 1
            out[name] = count
        return out

    def stored_tokens(self, name: str) -> int:
        """Tokens ``name``'s applied events have stored so far (a counter that only grows: a
        replica stores a prompt's blocks as its prefill completes, so the picker reads its
        progress through a backlog from it)."""
        return self._replicas[name].stored_tokens

    def blocks_of(self, name: str) -> int:
        """Block hashes held for ``name`` (its radix tree's size in pages, when exact)."""
        return len(self._replicas[name].blocks)

    def view(self, name: str, now: float) -> ReplicaView:
        r = self._replicas[name]
        known = self._known(r, now)
        reason = "" if known else (r.reason or "stale: nothing heard recently")
        return ReplicaView(
            name=name,
            known=known,
            reason=reason,
            blocks=len(r.blocks),
            last_seq=r.last_seq,
            highest_seen=r.highest_seen,
            last_ts=r.last_ts,
            restarts=r.restarts,
            gaps=r.gaps,
        )

    def __len__(self) -> int:
        """Block hashes held, summed over the replicas (a block two replicas hold counts twice)."""
        return sum(len(r.blocks) for r in self._replicas.values())
