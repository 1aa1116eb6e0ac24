"""The tests' child processes die with the test process: a run killed by a timeout (SIGKILL)
leaves no redis-server or emulator behind (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PARENT = """
import sys, time
from pathlib import Path
from tests.helpers import ChildProcess
child = ChildProcess([sys.executable, "-c", "import time; time.sleep(60)"], log=Path(sys.argv[1]))
print(child.proc.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie not reaped yet counts as gone
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_a_child_dies_when_the_test_process_is_killed(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "child.log")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert parent.stdout is not None
    with parent.stdout:
        child = int(parent.stdout.readline())
    assert _alive(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait(10)
    end = time.monotonic() + 10
    while _alive(child) and time.monotonic() < end:
        time.sleep(0.05)
    if _alive(child):  # clean up before failing
        os.kill(child, signal.SIGKILL)
        raise AssertionError("the child outlived its killed parent")
