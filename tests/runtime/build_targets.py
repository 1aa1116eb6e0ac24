"""Build targets the build worker process runs in tests (importable by module name)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from controlplane.reloader import Prepared, prepare
from policy import Policy, load_policy
from runtime.watcher import Loaded

__all__ = [
    "autogroup",
    "crash_on_marker",
    "pid_and_nice",
    "policy",
    "prepare_noting_pid",
    "slow",
    "tenant_table",
]


def policy(path: Path) -> Loaded[Policy]:
    return Loaded(load_policy(path))


def pid_and_nice(path: Path) -> Loaded[tuple[int, int]]:
    return Loaded((os.getpid(), os.nice(0)))


def autogroup(path: Path) -> Loaded[str]:
    """The worker's scheduling group, as Linux shows it (``/autogroup-N nice K``)."""
    return Loaded(Path("/proc/self/autogroup").read_text().strip())


def crash_on_marker(path: Path) -> Loaded[Policy]:
    """Dies like an out-of-memory kill while ``<path>.crash`` exists (each crash eats one line
    of it; an empty marker is removed)."""
    marker = path.with_name(path.name + ".crash")
    if marker.exists():
        lines = marker.read_text().splitlines()
        if len(lines) <= 1:
            marker.unlink()
        else:
            marker.write_text("\n".join(lines[1:]) + "\n")
        os._exit(137)
    return Loaded(load_policy(path))


def slow(path: Path) -> Loaded[int]:
    time.sleep(float(path.read_text()))
    return Loaded(0)


def tenant_table(path: Path) -> Loaded[dict[str, object]]:
    """A value with large containers (sent in slices)."""
    n = int(path.read_text())
    return Loaded({"tenants": {f"t{i}": (i, f"k{i}") for i in range(n)}, "order": list(range(n))})


def prepare_noting_pid(path: Path) -> Loaded[Prepared]:
    """The control plane's build (load, render), noting the building process's pid in
    ``<path>.pids``, one line per build."""
    with path.with_name(path.name + ".pids").open("a") as out:
        out.write(f"{os.getpid()}\n")
    return prepare(path)
