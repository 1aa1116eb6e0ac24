"""A token-level radix tree prefix cache with a capacity in tokens, as SGLang's RadixCache.

Pure data structure: no I/O, no clock (recency is a logical tick that each touch increments), no
randomness. The cache also plays the KV pool: ``allocate``/``release`` account for tokens that
running requests hold outside the tree, so ``total_size + allocated <= capacity`` always holds.

- ``match_prefix`` walks from the root, splits the node where a match ends inside it, and
  touches every node on the path (LRU recency).
- ``insert`` adds a sequence (prompt and output of a finished request), splitting nodes.
- ``lock``/``unlock`` take reference counts on the path root→node for running requests; a locked
  node is *protected*, an unlocked one *evictable*; both sizes are kept as invariants.
- ``evict`` pops unlocked leaves by least-recent use and cascades to parents that become leaves.
- With ``page_size`` > 1 every match and insertion is cut to whole pages.
- With ``record_events`` the cache records SGLang's KV-cache events as its tree changes (as
  SGLang's ``_record_store_event`` / ``_record_remove_event``): a new node → one ``BlockStored``
  with the block hashes of its pages (chained from its parent's last page), an evicted leaf → one
  ``BlockRemoved`` with its pages' hashes, ``reset`` (and construction) → ``AllBlocksCleared``.
  A split keeps every page's hash and records nothing. ``take_events`` hands them over.
- Per LoRA adapter (SGLang keys its tree by the request's ``lora_id``): ``match_prefix`` and
  ``insert`` take the adapter's id; each adapter has its own root, so the same tokens under two
  adapters never match each other. An adapter's block hashes chain from its seed
  (``prefixindex.adapters``) and its ``BlockStored`` events carry its ``lora_id``.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from prefixindex.adapters import adapter_prior
from prefixindex.hashing import block_id, chain_digests
from prefixindex.wire import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
)

__all__ = ["CacheNode", "InsertResult", "MatchResult", "RadixCache"]

Tokens = tuple[int, ...]


@dataclass(eq=False, slots=True)
class CacheNode:
    """One tree node: a token segment, its children keyed by their first page, a lock count."""

    key: Tokens
    parent: CacheNode | None
    children: dict[Tokens, CacheNode] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0
    serial: int = 0
    digests: list[bytes] | None = None  # one per page, only when events are recorded
    lora_id: int | None = None  # the adapter whose tree it belongs to (None: the base model)


@dataclass(frozen=True, slots=True)
class MatchResult:
    node: CacheNode
    length: int


@dataclass(frozen=True, slots=True)
class InsertResult:
    node: CacheNode
    prefix_length: int  # tokens that were already in the tree
    added: int  # tokens newly added to the tree


def _common_prefix(a: Tokens, b: Sequence[int], start: int, end: int) -> int:
    """Length of the common prefix of ``a`` and ``b[start:end]``."""
    n = min(len(a), end - start)
    if tuple(b[start : start + n]) == a[:n]:
        return n
    i = 0
    while i < n and a[i] == b[start + i]:
        i += 1
    return i


class RadixCache:
    """Prefix cache of token ids with LRU eviction of unlocked leaves."""

    def __init__(
        self, capacity_tokens: int, page_size: int = 1, *, record_events: bool = False
    ) -> None:
        if capacity_tokens <= 0 or page_size <= 0:
            raise ValueError("capacity_tokens and page_size must be > 0")
        self.capacity = capacity_tokens
        self.page_size = page_size
        self._serials = itertools.count(1)
        self._tick = 0
        self.root = CacheNode(key=(), parent=None, lock_ref=1)
        self._adapter_roots: dict[int, CacheNode] = {}  # one tree per LoRA adapter
        self.evictable_size = 0
        self.protected_size = 0
        self.allocated = 0
        self.record_events = record_events
        self._events: list[KvEvent] = []
        if record_events:
            self._events.append(AllBlocksCleared())

    # ---- sizes ---------------------------------------------------------------------------
    @property
    def total_size(self) -> int:
        """Tokens stored in the tree."""
        return self.evictable_size + self.protected_size

    @property
    def free(self) -> int:
        """Tokens neither in the tree nor allocated to running requests."""
        return self.capacity - self.total_size - self.allocated

    @property
    def available(self) -> int:
        """Tokens obtainable now: free plus evictable."""
        return self.free + self.evictable_size

    # ---- helpers -------------------------------------------------------------------------
    def _touch(self, node: CacheNode) -> None:
        self._tick += 1
        node.last_access = self._tick

    def _root_of(self, lora_id: int | None) -> CacheNode:
        if lora_id is None:
            return self.root
        root = self._adapter_roots.get(lora_id)
        if root is None:
            root = CacheNode(key=(), parent=None, lock_ref=1, lora_id=lora_id)
            self._adapter_roots[lora_id] = root
        return root

    def _roots(self) -> list[CacheNode]:
        return [self.root, *self._adapter_roots.values()]

    def _page_key(self, tokens: Sequence[int], start: int) -> Tokens:
        return tuple(tokens[start : start + self.page_size])

    def _aligned(self, n: int) -> int:
        return n - n % self.page_size

    def _split(self, node: CacheNode, at: int) -> CacheNode:
        """Split ``node`` so that its first ``at`` tokens form a new parent; return that parent."""
        parent = node.parent
        assert parent is not None and 0 < at < len(node.key)
        head = CacheNode(
            key=node.key[:at],
            parent=parent,
            lock_ref=node.lock_ref,
            last_access=node.last_access,
            lora_id=node.lora_id,
            serial=next(self._serials),
        )
        parent.children[self._page_key(head.key, 0)] = head
        node.key = node.key[at:]
        node.parent = head
        if node.digests is not None:
            pages = at // self.page_size
            head.digests, node.digests = node.digests[:pages], node.digests[pages:]
        head.children[self._page_key(node.key, 0)] = node
        return head

    # ---- lookup and insertion ------------------------------------------------------------
    def match_prefix(self, tokens: Sequence[int], lora_id: int | None = None) -> MatchResult:
        """Longest cached prefix of ``tokens`` under the adapter ``lora_id`` (whole pages)."""
        limit = self._aligned(len(tokens))
        node, i = self._root_of(lora_id), 0
        self._touch(node)
        while i < limit:
            child = node.children.get(self._page_key(tokens, i))
            if child is None:
                break
            common = self._aligned(_common_prefix(child.key, tokens, i, limit))
            if common < len(child.key):
                if common > 0:
                    node = self._split(child, common)
                    self._touch(node)
                    i += common
                break
            node = child
            self._touch(node)
            i += common
        return MatchResult(node=node, length=i)

    def insert(self, tokens: Sequence[int], lora_id: int | None = None) -> InsertResult:
        """Insert ``tokens`` (cut to whole pages) under the adapter ``lora_id``; new nodes are
        unlocked (evictable)."""
        limit = self._aligned(len(tokens))
        node, i = self._root_of(lora_id), 0
        self._touch(node)
        while i < limit:
            child = node.children.get(self._page_key(tokens, i))
            if child is None:
                new = CacheNode(
                    key=tuple(tokens[i:limit]),
                    parent=node,
                    serial=next(self._serials),
                    lora_id=lora_id,
                )
                node.children[self._page_key(new.key, 0)] = new
                self._touch(new)
                if self.record_events:
                    self._record_store(new)
                self.evictable_size += len(new.key)
                return InsertResult(node=new, prefix_length=i, added=limit - i)
            common = self._aligned(_common_prefix(child.key, tokens, i, limit))
            if common < len(child.key):
                child = self._split(child, common)
            node = child
            self._touch(node)
            i += common
        return InsertResult(node=node, prefix_length=limit, added=0)

    # ---- locks ---------------------------------------------------------------------------
    def lock(self, node: CacheNode) -> None:
        """Protect the path root→``node`` from eviction (one reference)."""
        cur: CacheNode | None = node
        while cur is not None and cur.parent is not None:
            if cur.lock_ref == 0:
                self.evictable_size -= len(cur.key)
                self.protected_size += len(cur.key)
            cur.lock_ref += 1
            cur = cur.parent

    def unlock(self, node: CacheNode) -> None:
        """Drop one reference on the path root→``node``."""
        cur: CacheNode | None = node
        while cur is not None and cur.parent is not None:
            if cur.lock_ref <= 0:
                raise RuntimeError("unlock of a node that is not locked")
            cur.lock_ref -= 1
            if cur.lock_ref == 0:
                self.evictable_size += len(cur.key)
                self.protected_size -= len(cur.key)
            cur = cur.parent

    # ---- eviction and the pool -----------------------------------------------------------
    def _leaves(self) -> Iterator[CacheNode]:
        stack = self._roots()
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node.parent is not None:
                yield node

    def evict(self, num_tokens: int) -> int:
        """Evict at least ``num_tokens`` (if possible) from unlocked leaves, LRU first."""
        heap = [(n.last_access, n.serial, n) for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(heap)
        evicted = 0
        while evicted < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[self._page_key(leaf.key, 0)]
            if leaf.digests is not None:
                hashes = [block_id(d) for d in leaf.digests]
                self._events.append(BlockRemoved(block_hashes=hashes, medium=MEDIUM_GPU))
            self.evictable_size -= len(leaf.key)
            evicted += len(leaf.key)
            if parent.parent is not None and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.serial, parent))
        return evicted

    def allocate(self, num_tokens: int) -> bool:
        """Reserve ``num_tokens`` outside the tree, evicting as needed; False if impossible."""
        if num_tokens < 0:
            raise ValueError("num_tokens must be >= 0")
        if num_tokens > self.available:
            return False
        if num_tokens > self.free:
            self.evict(num_tokens - self.free)
        self.allocated += num_tokens
        return True

    def release(self, num_tokens: int) -> None:
        """Return ``num_tokens`` reserved by ``allocate``."""
        if not 0 <= num_tokens <= self.allocated:
            raise ValueError(f"release of {num_tokens} tokens, {self.allocated} allocated")
        self.allocated -= num_tokens

    def reset(self) -> None:
        """Drop every node (the caller guarantees nothing is locked): ``/flush_cache``."""
        if self.protected_size:
            raise RuntimeError("cannot flush a cache with locked nodes")
        self.root.children.clear()
        self._adapter_roots.clear()
        self.evictable_size = 0
        if self.record_events:
            self._events.append(AllBlocksCleared())

    # ---- KV events -----------------------------------------------------------------------
    def _record_store(self, node: CacheNode) -> None:
        parent = node.parent
        parent_digest = parent.digests[-1] if parent is not None and parent.digests else None
        # the first pages under a root: an adapter's chain starts from its seed
        prior = parent_digest if parent_digest is not None else adapter_prior(node.lora_id)
        node.digests = list(chain_digests(node.key, self.page_size, prior))
        self._events.append(
            BlockStored(
                block_hashes=[block_id(d) for d in node.digests],
                parent_block_hash=block_id(parent_digest) if parent_digest is not None else None,
                token_ids=list(node.key),
                block_size=self.page_size,
                lora_id=node.lora_id,
                medium=MEDIUM_GPU,
            )
        )

    def take_events(self) -> list[KvEvent]:
        """The events recorded since the last call (empty unless ``record_events``)."""
        events, self._events = self._events, []
        return events

    # ---- inspection ----------------------------------------------------------------------
    def sequences(self) -> list[Tokens]:
        """Every root→leaf token sequence (for tests and debugging)."""
        out: list[Tokens] = []
        stack: list[tuple[CacheNode, Tokens]] = [(r, ()) for r in self._roots()]
        while stack:
            node, prefix = stack.pop()
            seq = prefix + node.key
            if not node.children and node.parent is not None:
                out.append(seq)
            stack.extend((c, seq) for c in node.children.values())
        return out

    def check_invariants(self) -> None:
        """Raise AssertionError when the tree or its size accounting is inconsistent."""
        evictable = protected = 0
        stack = self._roots()
        while stack:
            node = stack.pop()
            for first, child in node.children.items():
                assert child.parent is node, "child's parent link is wrong"
                assert child.key, "empty key below the root"
                assert len(child.key) % self.page_size == 0, "key not page aligned"
                assert first == child.key[: self.page_size], "child indexed by a wrong key"
                assert child.lock_ref >= 0, "negative lock_ref"
                assert child.lora_id == node.lora_id, "a node outside its adapter's tree"
                if node.parent is not None:
                    assert node.lock_ref >= child.lock_ref, "lock not held on the whole path"
                if child.lock_ref:
                    protected += len(child.key)
                else:
                    evictable += len(child.key)
                stack.append(child)
        assert evictable == self.evictable_size, f"evictable {evictable} != {self.evictable_size}"
        assert protected == self.protected_size, f"protected {protected} != {self.protected_size}"
        assert self.allocated >= 0, "negative allocation"
        assert self.total_size + self.allocated <= self.capacity, "over capacity"
