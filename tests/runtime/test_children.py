"""``runtime.children.Child``: the parent-death signal without Python between fork and exec.

A parent that runs gRPC threads (``tokenweir up``'s control plane, a service's worker supervisor)
starts children; a child that ran Python code after the fork could deadlock on a lock another
thread held (a worker that never started, seen in CI). The child is started through
``setpriv --pdeathsig``, so it still dies with a parent that was SIGKILLed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux setpriv")

_PARENT = """
import asyncio, os, sys, grpc
from runtime.children import Child

# Python's fork hooks run in a child only where Python code runs there before its exec
os.register_at_fork(after_in_child=lambda: open("python-ran-in-child", "w").close())

async def main():
    server = grpc.aio.server()  # gRPC threads running, as in tokenweir up
    server.add_insecure_port("127.0.0.1:0")
    await server.start()
    child = Child("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], None)
    child.start()
    print(child.pid, flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_child_dies_with_a_sigkilled_parent_that_runs_grpc_threads(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, env=env, cwd=tmp_path
    )
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        # the child execs the program itself (same pid), and no Python ran before that exec
        deadline = time.monotonic() + 20
        while b"time.sleep(60)" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline, Path(f"/proc/{pid}/cmdline").read_bytes()
            time.sleep(0.05)
        assert not (tmp_path / "python-ran-in-child").exists()
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while _alive(pid):
            assert time.monotonic() < deadline, "the child outlived its SIGKILLed parent"
            time.sleep(0.05)
    finally:
        parent.kill()
        parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()
