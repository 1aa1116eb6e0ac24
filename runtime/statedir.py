"""The state directory of ``tokenweir up``, and how the admin CLIs find the running mesh's Redis.

``tokenweir up -c mesh.yaml`` keeps what operators change live (quota edits, API keys and
revocations: Redis's append-only file) in a state directory that the next run reuses: by
default ``.tokenweir/state`` next to the policy file (``--state-dir`` elsewhere, ``--fresh`` to
start empty). While it runs, ``<state>/mesh.json`` says where its Redis listens, so
``tokenweir quota`` and ``tokenweir keys`` connect to it without flags.

Which Redis a CLI uses (:func:`find_redis`), first match wins: ``--redis-url``; the running
``up`` of the state directory; the policy's ``ratelimit.redis_url``; ``redis://127.0.0.1:6379/0``.
Every connection error names the URL tried, where it came from and the flag that changes it
(:func:`unreachable`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from runtime.redis_connect import redacted

__all__ = [
    "DEFAULT_REDIS",
    "MESH_FILE",
    "MeshInfo",
    "RedisTarget",
    "StateDirBusy",
    "StateLock",
    "default_state_dir",
    "find_redis",
    "read_mesh_info",
    "remove_mesh_info",
    "unreachable",
    "write_mesh_info",
]

DEFAULT_REDIS = "redis://127.0.0.1:6379/0"
MESH_FILE = "mesh.json"


class StateDirBusy(RuntimeError):
    """Another ``tokenweir up`` holds this state directory."""


def default_state_dir(policy_path: Path) -> Path:
    return policy_path.resolve().parent / ".tokenweir" / "state"


@dataclass(frozen=True)
class MeshInfo:
    """What a running ``tokenweir up`` tells the CLIs (``<state>/mesh.json``)."""

    pid: int
    redis_url: str | None
    policy: str


def write_mesh_info(state_dir: Path, info: MeshInfo) -> Path:
    """Write ``mesh.json`` atomically (a reader never sees half a file)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / MESH_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds Redis's password
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(info.__dict__, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def read_mesh_info(state_dir: Path) -> MeshInfo | None:
    """The running mesh of ``state_dir``; None when there is none (no file, an unreadable one,
    or one left behind by an ``up`` that no longer runs)."""
    try:
        raw = json.loads((state_dir / MESH_FILE).read_text())
        info = MeshInfo(int(raw["pid"]), raw.get("redis_url"), str(raw.get("policy", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return info if _alive(info.pid) else None


def remove_mesh_info(state_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (state_dir / MESH_FILE).unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class StateLock:
    """An exclusive lock on a state directory for the life of one ``up`` (two Redis servers on
    one append-only file would corrupt it). Released by ``release()`` or when the process ends."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._fh: IO[str] | None = None

    def acquire(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fh = (self.state_dir / "lock").open("a")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise StateDirBusy(
                f"another `tokenweir up` uses the state directory {self.state_dir} "
                "(stop it, or pass --state-dir DIR for a second mesh)"
            ) from None
        self._fh = fh

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None


@dataclass(frozen=True)
class RedisTarget:
    url: str
    source: str  # where the URL came from, in words


def find_redis(
    flag_url: str | None,
    state_dir: Path | None,
    policy_redis_url: str | None,
) -> RedisTarget:
    """The Redis a CLI should use (see the module docstring for the order)."""
    if flag_url:
        return RedisTarget(flag_url, "--redis-url")
    info = read_mesh_info(state_dir) if state_dir is not None else None
    if info is not None and info.redis_url:
        return RedisTarget(
            info.redis_url, f"the running `tokenweir up` (pid {info.pid}, {state_dir})"
        )
    if policy_redis_url:
        return RedisTarget(policy_redis_url, "the policy's ratelimit.redis_url")
    where = f" in {state_dir}" if state_dir is not None else ""
    return RedisTarget(DEFAULT_REDIS, f"the default: no running `tokenweir up` found{where}")


def unreachable(target: RedisTarget, exc: BaseException) -> str:
    """The error line for a failed connection: the URL, its source, what to change."""
    return (
        f"cannot reach Redis at {redacted(target.url)} ({target.source}): {exc}\n"
        "Start the mesh with `tokenweir up -c POLICY`, or pass --redis-url URL "
        "(--state-dir DIR for a mesh started with one)."
    )
