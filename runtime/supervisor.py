"""The worker supervisor: one process per extra worker of a service, all stopped together.

``python -m filters`` and ``python -m ratelimit_service`` serve one port from ``--processes N``
processes (SO_REUSEPORT): the first is the supervisor and worker 0; it starts workers 1..N-1
with ``argv_for(i)``, each in its own session (a terminal's Ctrl-C reaches only the supervisor,
which forwards SIGTERM once) and with :func:`~runtime.children.die_with_parent`.
On shutdown every worker gets SIGTERM and drains like the supervisor does; one that is still
running after the drain timeout (plus a margin) is killed.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

from runtime.children import Child

__all__ = ["WorkerSupervisor"]

log = logging.getLogger(__name__)


class WorkerSupervisor:
    """``start()`` workers 1..count-1; ``terminate()`` asks them to drain; ``aclose`` reaps."""

    def __init__(self, name: str, argv_for: Callable[[int], list[str]], count: int) -> None:
        self.workers = [Child(f"{name}[{i}]", argv_for(i), None) for i in range(1, count)]

    def start(self) -> None:
        for worker in self.workers:
            worker.start()
        if self.workers:
            log.info("started %d worker process(es)", len(self.workers))

    def alive(self) -> list[Child]:
        return [w for w in self.workers if w.alive()]

    def terminate(self) -> None:
        """SIGTERM to every worker: each reports NOT_SERVING and drains on its own."""
        for worker in self.workers:
            worker.signal(signal.SIGTERM)

    async def aclose(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for every worker to exit, then kill what is left."""
        self.terminate()
        await asyncio.gather(*(w.aclose(timeout) for w in self.workers))
        for worker in self.workers:
            if worker.returncode not in (None, 0):
                log.warning("%s exited with %s", worker.name, worker.returncode)
