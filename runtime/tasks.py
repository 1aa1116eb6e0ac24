"""Stopping background tasks without letting their failures escape as tracebacks, or hang.

A task that already died (a watcher that hit a ``RecursionError``, a probe whose socket broke)
holds its exception; awaiting it in ``aclose`` used to re-raise it and print thousands of lines
at shutdown. :func:`stop_task` cancels, waits, and logs such a failure as one line.

A cancellation can also be lost: a library that turns the ``CancelledError`` it receives into
a normal return (or into an error the task's own loop handles) leaves the task running with
its cancel request pending. The rate-limit service's Redis seeder lost one that way (inside
redis-py's pipeline) when SIGTERM came mid-seed, and its close waited forever on it. So
:func:`stop_task` cancels again while the task lives, and gives up -- logged -- after a bound;
loops that catch ``Exception`` call :func:`honour_cancel` after library calls.
"""

from __future__ import annotations

import asyncio
import logging

__all__ = ["honour_cancel", "stop_task"]

_log = logging.getLogger(__name__)
RECANCEL_EVERY = 0.5  # seconds between cancel requests to a task that outlives one
STOP_LIMIT = 5.0  # seconds after which a task that will not stop is left behind (logged)


async def stop_task(
    task: asyncio.Task[object] | None, *, log: logging.Logger = _log, limit: float = STOP_LIMIT
) -> None:
    """Cancel ``task`` and wait for it, at most ``limit`` seconds, cancelling it again every
    ``RECANCEL_EVERY`` s it survives. An exception it ended with is logged, never raised; our
    own cancellation is passed on."""
    if task is None:
        return
    loop = asyncio.get_running_loop()
    give_up = loop.time() + limit
    task.cancel()
    warned = False
    while True:
        await asyncio.wait({task}, timeout=max(0.0, min(RECANCEL_EVERY, give_up - loop.time())))
        if task.done():
            break
        if loop.time() >= give_up:
            log.error(
                "background task %s did not stop within %gs of being cancelled; left behind",
                task.get_name(),
                limit,
            )
            return
        if not warned:
            log.warning(
                "background task %s outlived its cancellation (swallowed inside a call it "
                "made); cancelling it again",
                task.get_name(),
            )
            warned = True
        task.cancel()
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:  # the task's own failure, reported once at shutdown
        log.error(
            "background task %s had failed: %s: %s",
            task.get_name(),
            type(exc).__name__,
            str(exc)[:300],
        )


def honour_cancel() -> None:
    """Raise ``CancelledError`` when the running task was asked to stop but a call it made
    swallowed the request (returned normally, or raised an ordinary error)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
