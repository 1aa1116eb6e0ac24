"""`tokenweir up` as a child process for integration tests: start it, read its banner up to
the ready line, stop it (SIGINT, or SIGKILL to test what a crash leaves behind)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["ROOT", "TOKENWEIR", "start_up", "stop_up"]

ROOT = Path(__file__).resolve().parents[2]
TOKENWEIR = Path(sys.executable).parent / "tokenweir"


def start_up(
    policy: Path,
    run_dir: Path,
    timeout: float = 180.0,  # a loaded CI box (the suite runs in parallel) starts slowly
    extra_args: tuple[str, ...] = (),
    *,
    prometheus: bool = False,
) -> tuple[subprocess.Popen[str], str]:
    """Start ``tokenweir up -c policy``; return it and its output up to ``tokenweir up: ready``
    (or up to its exit or the timeout: the caller asserts on the banner). Prometheus only when
    asked (it would add a scraper to every test's load)."""
    extra = extra_args if prometheus else (*extra_args, "--no-prometheus")
    proc = subprocess.Popen(
        [str(TOKENWEIR), "up", "-c", str(policy), "--run-dir", str(run_dir), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "tokenweir up: ready" in line:
            break
    return proc, "".join(lines)


def stop_up(proc: subprocess.Popen[str], *, kill: bool = False, timeout: float = 30.0) -> str:
    """Ctrl-C (or SIGKILL) ``up`` and wait for it; return the rest of its output."""
    if kill:
        proc.kill()
    else:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)
        raise
    finally:
        rest = ""
        if proc.stdout is not None:
            rest = proc.stdout.read()
            proc.stdout.close()
    return rest


def mesh_redis_url(policy: Path) -> str:
    """The running mesh's Redis URL, password included (``mesh.json`` in the default state
    directory: the banner shows the URL without its password)."""
    info = json.loads((policy.parent / ".tokenweir" / "state" / "mesh.json").read_text())
    return str(info["redis_url"])
