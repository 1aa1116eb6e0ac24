"""Loopback ports: pick a free one, wait until one accepts connections.

The one copy every process (``tokenweir up``, the launchers, the tests) uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable

from runtime.errors import ChildError, PortTimeout

__all__ = ["free_port", "port_open", "wait_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """Whether ``host:port`` accepts a TCP connection now."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=timeout):
        return True
    return False


async def wait_port(
    host: str,
    port: int,
    *,
    timeout: float = 30.0,
    alive: Callable[[], bool] | None = None,
    describe: Callable[[], str] = lambda: "",
    interval: float = 0.05,
) -> None:
    """Wait until ``host:port`` accepts connections.

    ``alive`` (when given) is asked between tries: a process that exited fails the wait at once
    with :class:`ChildError`; ``describe`` adds context (a log tail) to either error.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            raise ChildError(f"exited before listening on {host}:{port}\n{describe()}".rstrip())
        if await _connects(host, port):
            return
        await asyncio.sleep(interval)
    raise PortTimeout(f"nothing listened on {host}:{port} within {timeout}s\n{describe()}".rstrip())


async def _connects(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True
