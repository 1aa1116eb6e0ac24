"""Stopping background tasks without letting their failures escape as tracebacks.

A task that already died (a watcher that hit a ``RecursionError``, a probe whose socket broke)
holds its exception; awaiting it in ``aclose`` used to re-raise it and print thousands of lines
at shutdown. :func:`stop_task` cancels, waits, and logs such a failure as one line.
"""

from __future__ import annotations

import asyncio
import logging

__all__ = ["stop_task"]

_log = logging.getLogger(__name__)


async def stop_task(task: asyncio.Task[object] | None, *, log: logging.Logger = _log) -> None:
    """Cancel ``task`` and wait for it; an exception it ended with is logged, never raised."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise  # we are being cancelled ourselves: pass it on
    except Exception as exc:  # the task's own failure, reported once at shutdown
        log.error(
            "background task %s had failed: %s: %s",
            task.get_name(),
            type(exc).__name__,
            str(exc)[:300],
        )
