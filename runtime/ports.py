"""Loopback ports: pick a free one, wait until one accepts connections.

The one copy every process (``tokenweir up``, the launchers, the tests) uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import tempfile
import time
from collections.abc import Callable, Collection
from pathlib import Path

from runtime.errors import ChildError, PortTimeout

__all__ = [
    "RESERVED",
    "candidate_ranges",
    "claims_dir",
    "ephemeral_range",
    "free_port",
    "free_port_block",
    "port_open",
    "wait_port",
]


_EPHEMERAL_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_FALLBACK_EPHEMERAL = (32768, 60999)
_LOWEST = 10000
# the ports tokenweir's own components default to (a policy's gateway listener 10000, control
# plane 18000/18001, rate limit 18081, filters 18082, an Envoy admin 9901, the emulator 30000,
# and a few above each for replicas): never handed out, or a test's gateway on a picked port
# 18001 collides with the control plane's default metrics port of the policy it starts
# (fresh-clone CI: "port 18001 is already used by control_plane.metrics")
RESERVED = frozenset(
    p for base in (9901, 10000, 18000, 18081, 30000) for p in range(base, base + 16)
)
_handed_out: set[int] = set()
_rng = random.Random()
# claims shared by every process of this user on the machine: one empty file per port handed
# out, for a while after (a port is bound within seconds of being handed out; a long claim would
# leave too few blocks of 100 free for a port plan where the suite hands out ~500 a minute)
CLAIMS_ENV = "TOKENWEIR_PORT_CLAIMS"
CLAIM_TTL_S = 30.0


def claims_dir() -> Path:
    """Where claims live: ``$TOKENWEIR_PORT_CLAIMS``, else a folder of this user in the temp folder."""
    where = os.environ.get(CLAIMS_ENV)
    return Path(where) if where else Path(tempfile.gettempdir()) / f"tokenweir-ports-{os.getuid()}"


def ephemeral_range(path: Path = _EPHEMERAL_FILE) -> tuple[int, int]:
    """The kernel's range for outgoing connections' source ports (and for ``bind(port 0)``)."""
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return _FALLBACK_EPHEMERAL
    return low, high


def candidate_ranges(ephemeral: tuple[int, int]) -> list[tuple[int, int]]:
    """Port ranges (inclusive) outside the ephemeral range, largest first."""
    low, high = ephemeral
    ranges = [(_LOWEST, low - 1), (high + 1, 65535)]
    ranges = [(a, b) for a, b in ranges if b - a >= 1000]
    return sorted(ranges, key=lambda r: r[0] - r[1]) or [(_LOWEST, 65535)]


def _claim(block: range, claims: Path | None = None, ttl: float = CLAIM_TTL_S) -> bool:
    """Claim every port of ``block`` machine-wide (``O_EXCL`` files in :func:`claims_dir`): False
    when another process (a pytest worker, another ``up``) handed one of them out in the last
    ``ttl`` seconds; an older claim is taken over. Without a usable claims folder, only this
    process's own hand-outs are remembered."""
    folder = claims if claims is not None else claims_dir()
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return True
    made: list[Path] = []
    for port in block:
        path = folder / str(port)
        taken = _take(path, ttl)
        if taken is None:
            continue  # an unwritable folder: this process's own record still holds
        if not taken:
            for mine in made:
                mine.unlink(missing_ok=True)
            return False
        made.append(path)
    return True


def _take(path: Path, ttl: float) -> bool | None:
    """Create the claim ``path`` (True), find it held (False), or fail to write (None). A claim
    older than ``ttl`` is removed and taken again with ``O_EXCL``: of two processes that find it
    stale at once, one creates it."""
    for _ in range(2):
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            return True
        except FileExistsError:
            try:
                if time.time() - path.stat().st_mtime <= ttl:
                    return False
                path.unlink()
            except FileNotFoundError:
                continue  # gone meanwhile: try to create it once more
            except OSError:
                return False
        except OSError:
            return None
    return False


def _bindable(host: str, ports: range) -> bool:
    socks = []
    try:
        for port in ports:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()


def free_port_block(
    count: int = 1, host: str = "127.0.0.1", tries: int = 200, avoid: Collection[int] = ()
) -> int:
    """The first of ``count`` consecutive ports on ``host`` that nothing listens on right now.

    Ports come from outside the kernel's ephemeral range: ``bind(port 0)`` and outgoing
    connections take their ports from inside it, so neither can grab a port handed out here
    between this call and the server's bind (a race that made Envoy's listener fail with
    "Address already in use" under a loaded test run). A port is handed out once per process,
    and once per :data:`CLAIM_TTL_S` on the machine (:func:`_claim`: pytest workers picking at
    random from the same ranges gave one port to two tests, and an emulator found its port
    taken), and never one of ``avoid`` (ports a part not started yet will listen on: ``up``'s
    port plan). Ranges are drawn by their size.
    """
    ranges = candidate_ranges(ephemeral_range())
    sizes = [high - low + 1 for low, high in ranges]
    for _ in range(tries):
        low, high = _rng.choices(ranges, weights=sizes)[0]
        if high - low + 1 < count:
            continue
        base = _rng.randrange(low, high - count + 2)
        block = range(base, base + count)
        if RESERVED.intersection(block) or _handed_out.intersection(block):
            continue
        if avoid and not set(avoid).isdisjoint(block):
            continue
        if not _bindable(host, block) or not _claim(block):
            continue
        _handed_out.update(block)
        return base
    raise OSError(f"no block of {count} free ports on {host} after {tries} tries")


def free_port(host: str = "127.0.0.1", avoid: Collection[int] = ()) -> int:
    """A TCP port on ``host`` that nothing listens on right now (see :func:`free_port_block`)."""
    return free_port_block(1, host, avoid=avoid)


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
        async with asyncio.timeout(timeout):  # not wait_for: it can drop a cancel (bpo-42130)
            _, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True
