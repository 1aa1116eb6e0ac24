"""The pool endpoint file the control plane watches: one ``host:port`` per line.

Lines starting with ``#`` are comments; blank lines are ignored. Every change is written
atomically (a temporary file in the same folder, then ``os.replace``), under an exclusive
``flock`` on ``<file>.lock`` so several launchers on one host can share a pool file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "add_endpoint",
    "file_lock",
    "parse_endpoints",
    "read_endpoints",
    "remove_endpoint",
    "write_atomic",
]

_HEADER = "# tokenweir pool endpoints: one host:port per line (written by backends.sglang)\n"


def parse_endpoints(text: str) -> list[str]:
    """Endpoints in file order, without comments, blanks or duplicates."""
    out: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        host, sep, port = line.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"not a host:port endpoint: {line!r}")
        if line not in out:
            out.append(line)
    return out


def read_endpoints(path: Path) -> list[str]:
    """The endpoints listed in ``path`` (empty when it does not exist)."""
    try:
        return parse_endpoints(path.read_text())
    except FileNotFoundError:
        return []


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step (readers see the old or the new file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _rewrite(path: Path, endpoints: list[str]) -> None:
    comments = []
    if path.exists():
        comments = [ln for ln in path.read_text().splitlines() if ln.strip().startswith("#")]
    head = "\n".join(comments) + "\n" if comments else _HEADER
    write_atomic(path, head + "".join(f"{e}\n" for e in endpoints))


def add_endpoint(path: Path, endpoint: str) -> None:
    """Register ``endpoint`` (``host:port``) in the pool file, once."""
    parse_endpoints(endpoint)  # validates
    with file_lock(path):
        current = read_endpoints(path)
        if endpoint not in current:
            _rewrite(path, [*current, endpoint])


def remove_endpoint(path: Path, endpoint: str) -> None:
    """Remove ``endpoint`` from the pool file (no error when absent)."""
    with file_lock(path):
        current = read_endpoints(path)
        if endpoint in current:
            _rewrite(path, [e for e in current if e != endpoint])
