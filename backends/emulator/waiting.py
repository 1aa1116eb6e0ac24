"""The scheduler's waiting queue: bounded as ``--max-queued-requests``, ordered as SGLang's.

FCFS by default (the order requests arrived or came back). With priority scheduling the queue is
sorted each step (``sort``), and a full queue gives a more urgent newcomer the place of its
least urgent request (``offer`` names the evicted one; the scheduler aborts it).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

from backends.emulator.priority import PriorityConfig, queue_eviction
from backends.emulator.request import EmuRequest

__all__ = ["WaitingQueue"]


class WaitingQueue:
    """Requests waiting for admission, each stamped with its latest entry (``queue_seq``)."""

    def __init__(self, bound: int, priority: PriorityConfig) -> None:
        self.bound = bound
        self.priority = priority
        self._q: collections.deque[EmuRequest] = collections.deque()
        self._seq = 0

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[EmuRequest]:
        return iter(self._q)

    def __contains__(self, req: object) -> bool:
        return req in self._q

    def head(self) -> EmuRequest:
        return self._q[0]

    def popleft(self) -> EmuRequest:
        return self._q.popleft()

    def remove(self, req: EmuRequest) -> None:
        self._q.remove(req)

    def offer(self, req: EmuRequest) -> tuple[bool, EmuRequest | None]:
        """Queue ``req`` within the bound: (queued?, the request evicted for it, to abort)."""
        evicted = None
        if len(self._q) >= self.bound:
            evicted = queue_eviction(self.priority, req, self._q)
            if evicted is None:
                return False, None
            self._q.remove(evicted)
        self.push(req)
        return True, evicted

    def push(self, req: EmuRequest) -> None:
        """Queue ``req`` past the bound (a retracted request comes back unconditionally)."""
        self._seq += 1
        req.queue_seq = self._seq
        self._q.append(req)

    def sort(self) -> None:
        """Most urgent first, then by entry (priority scheduling on; FCFS is left alone)."""
        if self.priority.enabled:
            self._q = collections.deque(self.priority.queue_order(self._q))
