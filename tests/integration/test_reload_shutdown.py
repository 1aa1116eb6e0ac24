"""Shutdown right after a big reload (issue 9): ``python -m ratelimit_service`` (real Redis,
the built-in h2 transport, building in its worker process) reloads 100 -> 10,000 tenants, gets
SIGTERM while it seeds Redis, and exits 0 within its drain limit, leaving no build worker
behind. It hung 4 of 9 runs until the cause was found: redis-py's pipeline swallowed the
seeder's cancellation mid-seed and the close waited on the seeder forever (0 of 18 since)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ChildProcess, free_port, redis_server, wait_for_port

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(400)]
DRAIN_S = 5.0


def _policy(port: int, redis: int, tenants: int) -> str:
    lines = [
        "version: 1",
        f"ratelimit: {{address: 127.0.0.1:{port}, redis_url: 'redis://127.0.0.1:{redis}/0', "
        f"drain_timeout: {DRAIN_S:g}s}}",
        "tiers:",
        "  std:",
        "    quotas: {requests: {burst: 1000, refill_per_second: 100}}",
        "tenants:",
    ]
    lines += [
        f"  t{i}: {{tier: std, api_keys: [tw-key-{i:07d}], "
        f"quotas: {{tokens: {{burst: {1000 + i}, refill_per_second: 10}}}}}}"
        for i in range(tenants)
    ]
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _children(pid: int) -> list[int]:
    return [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _gone(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split()[2] == "Z"


def test_sigterm_right_after_a_10k_tenant_reload_stops_within_the_drain_limit(
    tmp_path: Path,
) -> None:
    port = free_port()
    path = tmp_path / "mesh.yaml"
    with redis_server() as redis:
        _write(path, _policy(port, redis, 100))
        argv = [sys.executable, "-m", "ratelimit_service", "--policy", str(path)]
        child = ChildProcess(argv, log=tmp_path / "ratelimit.log")
        try:
            wait_for_port(port, timeout=60)
            _write(path, _policy(port, redis, 10_000))
            deadline = time.monotonic() + 300
            while "policy reloaded: 10000 tenants" not in child.output():
                assert child.alive(), child.output()[-3000:]
                assert time.monotonic() < deadline, "the 10k-tenant policy was not applied"
                time.sleep(0.1)
            workers = _children(child.proc.pid)  # its build worker, when it builds in one
            child.proc.send_signal(signal.SIGTERM)  # while Redis is being seeded
            try:
                code = child.proc.wait(DRAIN_S + 10)
            except subprocess.TimeoutExpired:
                pytest.fail(f"still running {DRAIN_S + 10:g}s after SIGTERM:\n{child.output()}")
            assert code == 0, child.output()[-3000:]
            assert all(_gone(w) for w in workers), workers
        finally:
            child.close()
    out = child.log.read_text()
    assert "Traceback" not in out, out[-3000:]
    assert os.path.exists(path)
