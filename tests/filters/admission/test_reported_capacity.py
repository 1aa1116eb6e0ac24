"""A pool whose policy declares no capacity is admitted against the running slots its replicas
report (/get_server_info through the control plane's pool state), split like a declared one."""

from __future__ import annotations

import logging

import pytest

from filters.plugins.admission.gate import Gates
from filters.plugins.admission.signal import (
    admission_source,
    capacity_source,
    pool_capacity,
    pool_state_reader,
)
from policy import load_policy_text
from poolstate.reader import PoolStateReader
from poolstate.state import PoolState, PoolSummary, ReplicaState
from tests.filters.conftest import FakeClock

POLICY = """
version: 1
control_plane: {{metrics: 127.0.0.1:18555}}
filters: {{address: 127.0.0.1:18556, processes: {processes}}}
admission: {{gateways: {gateways}}}
pools:
  chat: {{models: [m1], endpoints: [127.0.0.1:9001, 127.0.0.1:9002]{capacity}}}
gateways:
  edge:
    routes:
      - {{name: llm, pool: chat, match: {{prefix: /v1/}}, filters: {{plugins: [admission]}}}}
"""
DECLARED = ", capacity: {max_running_requests: 6}"


def policy_text(*, gateways: int = 1, processes: int = 1, capacity: str = "") -> str:
    return POLICY.format(gateways=gateways, processes=processes, capacity=capacity)


def summary(*caps: int | None, stale: tuple[int, ...] = ()) -> PoolSummary:
    """Replicas a, b, ...: each reports ``cap`` running slots (None: not read yet)."""
    reps = {
        f"127.0.0.1:900{i + 1}": ReplicaState(saturation=2.0 if i in stale else 0.1, stale=i in stale)
        for i in range(len(caps))
    }  # fmt: skip
    total = sum(c or 0 for i, c in enumerate(caps) if i not in stale)
    return PoolSummary(reps, capacity_running=total)


def publish(reader: PoolStateReader, version: int, s: PoolSummary) -> None:
    assert reader.accept(PoolState(version, 0.0, {"chat": s}).to_json())


def setup(text: str) -> tuple[FakeClock, PoolStateReader, Gates]:
    clock = FakeClock()
    policy = load_policy_text(text)
    reader = pool_state_reader(policy, clock)
    assert reader is not None
    gates = Gates(
        clock=clock,
        wall=clock,
        saturation=admission_source(reader),
        capacity=capacity_source(reader),
    )
    gates.configure(policy)
    return clock, reader, gates


def limit(gates: Gates) -> int | None:
    gates.follow_reported()  # what the filter server does at each new pool state
    gate = gates.gate("chat")  # what a request's admission reads
    assert gate is not None
    return gate.core.max_requests


def test_pool_capacity_is_the_mean_reported_times_every_replica() -> None:
    assert pool_capacity(summary(16, 16)) == 32
    assert pool_capacity(summary(16, 8)) == 24
    # a silent replica: the others' mean stands in for it (saturation counts it as full)
    assert pool_capacity(summary(16, 16, stale=(1,))) == 32
    assert pool_capacity(summary(16, 16, stale=(0, 1))) is None  # nobody answers: unknown
    assert pool_capacity(summary(None, None)) is None  # server info not read yet
    assert pool_capacity(PoolSummary()) is None


def test_no_declared_capacity_follows_what_the_replicas_report() -> None:
    clock, reader, gates = setup(policy_text())
    assert limit(gates) is None  # nothing known yet: not limited (as before)
    publish(reader, 1, summary(16, 16))
    assert limit(gates) == 32
    gate = gates.gate("chat")
    assert gate is not None
    assert gates.metrics.limit.labels("chat")._value.get() == 32
    publish(reader, 2, summary(8, 8))  # the replicas restarted with fewer slots
    assert limit(gates) == 16
    clock.now += 60  # the control plane went silent: the last figure holds, not "unlimited"
    assert reader.stale
    assert limit(gates) == 16


def test_a_dead_replica_lowers_admission_once_not_twice() -> None:
    """The dead replica's slots leave through saturation (it offers none); the pool's capacity
    stays whole, so the limit is the live replica's 16, not 8."""
    _, reader, gates = setup(policy_text())
    publish(reader, 1, summary(16, 16, stale=(1,)))
    assert limit(gates) == 16


def test_reported_capacity_is_split_over_gateways_and_processes() -> None:
    _, reader, gates = setup(policy_text(gateways=2, processes=2))
    publish(reader, 1, summary(16, 16))
    assert limit(gates) == 8  # 32 / (2 gateways x 2 filter processes)


def test_a_reload_keeps_following_with_the_new_split() -> None:
    _, reader, gates = setup(policy_text())
    publish(reader, 1, summary(16, 16))
    assert limit(gates) == 32
    gates.configure(load_policy_text(policy_text(gateways=4)))
    assert limit(gates) == 8


def test_a_declared_capacity_wins_over_the_reported_one() -> None:
    _, reader, gates = setup(policy_text(capacity=DECLARED))
    assert limit(gates) == 12  # 6 per replica x 2
    publish(reader, 1, summary(256, 256))
    assert limit(gates) == 12
    # declaring it later (a reload) takes over from the reported figure; dropping it again
    # goes back to the last reported one
    _, reader, gates = setup(policy_text())
    publish(reader, 1, summary(16, 16))
    assert limit(gates) == 32
    gates.configure(load_policy_text(policy_text(capacity=DECLARED)))
    assert limit(gates) == 12
    gates.configure(load_policy_text(policy_text()))
    assert limit(gates) == 32


def test_the_figure_followed_is_logged_once_per_change(caplog: pytest.LogCaptureFixture) -> None:
    _, reader, gates = setup(policy_text())
    with caplog.at_level(logging.INFO, logger="tokenweir.admission"):
        publish(reader, 1, summary(16, 16))
        for _ in range(5):
            limit(gates)
        publish(reader, 2, summary(16, 16))
        limit(gates)
    lines = [r.getMessage() for r in caplog.records if "report" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "pool chat: admitting up to 32 requests" in lines[0]
    assert "pools.chat.capacity.max_running_requests" in lines[0]


def test_a_new_pool_state_sets_the_limit_without_a_request() -> None:
    _, reader, gates = setup(policy_text())
    publish(reader, 1, summary(16, 16))
    gates.follow_reported()  # what the filter server does at each new pool state
    assert gates.metrics.limit.labels("chat")._value.get() == 32
    gate = gates._gates["chat"]  # not through gate(): no request came
    assert gate.core.max_requests == 32
