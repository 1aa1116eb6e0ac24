"""runtime.ports / runtime.children: waiting for a port fails early when the process died."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.children import Child, ChildError, wait_child_line, wait_child_port
from runtime.errors import PortTimeout
from runtime.ports import (
    CLAIMS_ENV,
    _claim,
    candidate_ranges,
    ephemeral_range,
    free_port,
    free_port_block,
    wait_port,
)


async def test_wait_port_fails_at_once_when_the_process_is_gone() -> None:
    with pytest.raises(ChildError, match=r"exited before listening on 127\.0\.0\.1:9"):
        await wait_port("127.0.0.1", 9, alive=lambda: False, describe=lambda: "last log line")


async def test_wait_port_times_out_as_port_timeout() -> None:
    with pytest.raises(PortTimeout):
        await wait_port("127.0.0.1", 9, timeout=0)


async def test_wait_child_port_names_the_child_and_shows_its_log(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("boom: bad config\n")
    child = Child("ratelimit", ["true"], log)  # never started: not alive
    with pytest.raises(ChildError, match=r"ratelimit exited with None:\nboom: bad config"):
        await wait_child_port("127.0.0.1", 9, child)


async def test_wait_child_line_returns_on_the_line_and_fails_when_the_child_exits(
    tmp_path: Path,
) -> None:
    code = "import sys, time; print('up: ready', flush=True); time.sleep(30)"
    child = Child("up", [sys.executable, "-c", code], tmp_path / "up.log")
    child.start()
    try:
        await wait_child_line(child, "up: ready", timeout=20)
    finally:
        await child.aclose(1.0)
    gone = Child("gone", [sys.executable, "-c", "print('boom: bad config')"], tmp_path / "g.log")
    gone.start()
    with pytest.raises(ChildError, match=r"gone did not get ready:\nboom: bad config"):
        await wait_child_line(gone, "up: ready", timeout=20)


def test_ports_come_from_outside_the_ephemeral_range(tmp_path: Path) -> None:
    low, high = ephemeral_range()
    seen = {free_port() for _ in range(50)}
    assert len(seen) == 50  # never the same port twice in one process
    assert all(not low <= p <= high for p in seen)


def test_a_block_is_consecutive_and_bindable() -> None:
    base = free_port_block(3)
    low, high = ephemeral_range()
    assert not any(low <= p <= high for p in range(base, base + 3))
    for p in range(base, base + 3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_candidate_ranges_skip_the_ephemeral_range() -> None:
    assert candidate_ranges((32768, 60999)) == [(10000, 32767), (61000, 65535)]
    assert candidate_ranges((1024, 65000)) == [(10000, 65535)]  # nothing outside: fall back


def test_an_unreadable_range_file_falls_back(tmp_path: Path) -> None:
    bad = tmp_path / "range"
    bad.write_text("nonsense")
    assert ephemeral_range(bad) == (32768, 60999)
    assert ephemeral_range(tmp_path / "missing") == (32768, 60999)


def test_the_default_ports_of_a_policy_are_never_handed_out() -> None:
    """A picked port must not be one the policy's components default to: a test's gateway on
    a picked 18001 was refused as "already used by control_plane.metrics"."""
    from policy import load_policy_text
    from runtime.ports import RESERVED

    policy = load_policy_text("version: 1\ngateways: {edge: {routes: []}}\n")
    cp = policy.control_plane
    defaults = {cp.xds.port, cp.metrics.port, policy.gateways["edge"].listen.port}
    from policy.servers import FiltersServer, RateLimitServer

    defaults |= {FiltersServer().address.port, RateLimitServer().address.port, 9901, 30000}
    assert defaults <= RESERVED
    assert not RESERVED.intersection(free_port() for _ in range(300))


def test_ports_to_avoid_are_never_handed_out() -> None:
    """`up` picks Redis's, the Envoy admins' and Prometheus's ports off its port plan."""
    low, high = candidate_ranges(ephemeral_range())[0]
    avoid = frozenset(range(low, (low + high) // 2))  # half of the range a pick comes from
    picked = [free_port(avoid=avoid) for _ in range(40)]
    assert not avoid.intersection(picked), sorted(avoid.intersection(picked))
    base = free_port_block(3, avoid=avoid)
    assert not avoid.intersection(range(base, base + 3))


def test_a_port_claimed_by_another_process_is_not_handed_out(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    assert _claim(range(20000, 20002), claims)
    assert not _claim(range(20001, 20003), claims)  # 20001 is taken: nothing of this block
    assert not (claims / "20002").exists()  # the block's own claims are given back
    old = time.time() - 3600
    os.utime(claims / "20000", (old, old))
    assert _claim(range(20000, 20001), claims, ttl=60)  # a stale claim is taken over
    assert time.time() - (claims / "20000").stat().st_mtime < 60
    assert not _claim(range(20000, 20001), claims, ttl=60)


_PICKER = """
import sys
from runtime.ports import free_port
print(" ".join(str(free_port()) for _ in range(int(sys.argv[1]))))
"""


def test_processes_picking_at_once_never_get_the_same_port(tmp_path: Path) -> None:
    """Two pytest workers picked the same port (an emulator then found it taken): 2 x 600 picks
    from about 27,000 ports give the same one twice ~13 times without the machine-wide claims.
    (The claims go to a folder of this test's own: 1,200 of them in the machine's folder would
    leave other tests' port plans few free blocks of 100.)"""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), CLAIMS_ENV: str(tmp_path / "claims")}
    procs = [
        subprocess.Popen([sys.executable, "-c", _PICKER, "600"], stdout=subprocess.PIPE, env=env)
        for _ in range(2)
    ]
    picked = [set(map(int, p.communicate(timeout=60)[0].split())) for p in procs]
    assert [len(p) for p in picked] == [600, 600]
    assert not picked[0] & picked[1], sorted(picked[0] & picked[1])
    assert len(list((tmp_path / "claims").iterdir())) == 1200
