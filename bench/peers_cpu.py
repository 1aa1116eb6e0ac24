"""CPU time per process of a process tree, read from ``/proc`` (Linux), labelled by what runs.

``snapshot(roots, proc)`` walks every root pid and its descendants (``/proc/<pid>/task/*/children``)
and returns ``{label: ProcCpu}``: user + system seconds summed over the processes with that label,
whether they are Python processes, and the seconds they spent runnable but waiting for a CPU
(``/proc/<pid>/task/*/schedstat``: on a small shared box a process's latency is often that wait, not
its own work). ``label_of`` names a process from its command line (Envoy,
the filter server, the rate-limit service, the control plane, Redis, LiteLLM, sglang-router, the
emulator); ``per_request_ms`` turns two snapshots into milliseconds of CPU per request. ``proc`` is
the /proc directory (a fake tree in tests).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProcCpu", "label_of", "per_request_ms", "snapshot"]

PROC = Path("/proc")
_LABELS = (  # first match wins: (substring of the command line, label)
    ("multiprocessing.spawn", "spawned-worker"),  # e.g. the picker's mapper process (before)
    ("filters.plugins.picker.worker", "spawned-worker"),  # the picker's mapper process (now)
    ("sglang", "sglang-router"),  # the router renames its process "sglang::router"
    ("litellm", "litellm"),
    ("backends.emulator", "emulator"),
    ("redis-server", "redis"),
    ("ratelimit_service", "ratelimit_service"),
    ("filters", "filters"),
    ("envoy", "envoy"),
    ("tokenweir", "controlplane"),
)


@dataclass(frozen=True, slots=True)
class ProcCpu:
    seconds: float
    python: bool
    processes: int
    waited: float = 0.0  # runnable, on a run queue, not running (0 where schedstat is absent)


def label_of(cmdline: list[str]) -> str:
    """A short name for a process: its role in the benchmark, else its program's name."""
    text = " ".join(cmdline)
    if len(cmdline) >= 3 and cmdline[1] == "-m":  # python -m <module>
        text = cmdline[2] + " " + text
    for needle, label in _LABELS:
        if needle in text:
            return label
    return Path(cmdline[0]).name if cmdline else "?"


def _is_python(cmdline: list[str]) -> bool:
    return bool(cmdline) and Path(cmdline[0]).name.startswith("python")


def _read_cmdline(proc: Path, pid: int) -> list[str]:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _cpu_seconds(proc: Path, pid: int, ticks: int) -> float | None:
    try:
        fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime


def _waited_seconds(proc: Path, pid: int) -> float:
    """Summed over the process's threads (``/proc/<pid>/schedstat`` is its main thread's only:
    Envoy's workers and a Rust router's threads would go uncounted)."""
    total = 0.0
    for f in (proc / str(pid) / "task").glob("*/schedstat"):
        try:
            total += int(f.read_text().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            continue
    return total


def _children(proc: Path, pid: int) -> list[int]:
    out: list[int] = []
    for f in (proc / str(pid) / "task").glob("*/children"):
        try:
            out += [int(x) for x in f.read_text().split()]
        except OSError:
            continue
    return out


def _tree(proc: Path, roots: Iterable[int]) -> list[int]:
    seen: list[int] = []
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.append(pid)
        todo += _children(proc, pid)
    return seen


def snapshot(
    roots: Iterable[int], proc: Path = PROC, ticks: int | None = None
) -> dict[str, ProcCpu]:
    """CPU seconds so far of every process under ``roots``, summed per label."""
    hz = ticks or os.sysconf("SC_CLK_TCK")
    acc: dict[str, tuple[float, bool, int, float]] = {}
    for pid in _tree(proc, roots):
        cpu = _cpu_seconds(proc, pid, hz)
        if cpu is None:
            continue
        cmd = _read_cmdline(proc, pid)
        if not cmd:
            continue
        label = label_of(cmd)
        s, py, n, w = acc.get(label, (0.0, False, 0, 0.0))
        acc[label] = (s + cpu, py or _is_python(cmd), n + 1, w + _waited_seconds(proc, pid))
    return {k: ProcCpu(s, py, n, w) for k, (s, py, n, w) in acc.items()}


def per_request_ms(
    before: Mapping[str, ProcCpu], after: Mapping[str, ProcCpu], requests: int
) -> dict[str, dict[str, float | bool]]:
    """``{label: {"ms": CPU ms per request, "python": bool, "runqueue_ms": ms per request spent
    waiting for a CPU}}`` between two snapshots."""
    if requests <= 0:
        return {}
    out: dict[str, dict[str, float | bool]] = {}
    for label, a in after.items():
        b = before.get(label)
        used = a.seconds - (b.seconds if b else 0.0)
        waited = a.waited - (b.waited if b else 0.0)
        out[label] = {
            "ms": round(max(used, 0.0) * 1000 / requests, 4),
            "python": a.python,
            "runqueue_ms": round(max(waited, 0.0) * 1000 / requests, 4),
        }
    return out
