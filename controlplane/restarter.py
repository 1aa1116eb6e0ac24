"""Which children of ``tokenweir up`` are replicas, and whether a dead one may start again.

A replica that dies is started again, as a Kubernetes Deployment would: the others keep
serving meanwhile (docs/deploy.md). One that dies ``max_restarts`` times within ``window``
seconds is crash-looping: ``up`` stops and shows its log. A child that is not a replica
(a single server, an emulator, Redis) ends ``up`` when it dies, as before.
"""

from __future__ import annotations

from collections import deque

from controlplane.policy import Address
from runtime.children import Child

__all__ = ["Restarter"]


class Restarter:
    def __init__(self, *, max_restarts: int = 3, window: float = 30.0) -> None:
        self.max_restarts = max_restarts
        self.window = window
        self._addresses: dict[str, Address] = {}  # child name → the port it must open
        self._envoys: set[str] = set()
        self._restarts: dict[str, deque[float]] = {}

    def watch(self, child: Child, address: Address) -> None:
        self._addresses[child.name] = address

    def watch_envoy(self, key: str) -> None:
        self._envoys.add(key)

    def address(self, child: Child) -> Address:
        return self._addresses[child.name]

    def generation(self, name: str) -> int:
        """How many times ``name`` was started again (an Envoy's fresh ``--base-id``)."""
        return len(self._restarts.get(name, ()))

    def may_restart(self, name: str, now: float) -> bool:
        """Whether ``name`` is a replica that has not crash-looped; records the restart."""
        if name not in self._addresses and name not in self._envoys:
            return False
        times = self._restarts.setdefault(name, deque())
        recent = [t for t in times if now - t < self.window]
        if len(recent) >= self.max_restarts:
            return False
        times.append(now)
        return True
