"""`up` starts a dead replica again, unless it is not a replica or is crash-looping."""

from __future__ import annotations

from controlplane.policy import Address
from controlplane.restarter import Restarter
from runtime.children import Child


def test_only_replicas_restart_and_a_crash_loop_stops() -> None:
    r = Restarter(max_restarts=3, window=30.0)
    child = Child("filters#1", ["true"], None)
    assert not r.may_restart("filters#1", 0.0)  # not watched: a single server ends `up`
    r.watch(child, Address("127.0.0.1", 1))
    r.watch_envoy("edge#0")
    assert [r.may_restart("filters#1", t) for t in (0.0, 1.0, 2.0, 3.0)] == [True] * 3 + [False]
    assert r.may_restart("filters#1", 40.0)  # the window moved on
    assert r.may_restart("edge#0", 0.0) and r.generation("edge#0") == 1  # a fresh --base-id
    assert r.address(child) == Address("127.0.0.1", 1)
