"""A pool that declares ``priority_scheduling`` is admitted preemptively only while no answering
replica says it schedules otherwise; unknown (no pool state, a replica that does not say)
keeps the policy's word."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry

from filters.plugins.admission.core import Shed
from filters.plugins.admission.gate import Gates, PoolGate
from filters.plugins.admission.queues import Ticket
from filters.plugins.admission.signal import pool_state_reader, ranking_source
from policy import load_policy_text
from poolstate import PoolState, PoolSummary, Ranking, ReplicaState
from poolstate.reader import PoolStateReader
from tests.filters.conftest import FakeClock

POLICY = """
version: 1
control_plane: {{metrics: 127.0.0.1:18555}}
filters: {{address: 127.0.0.1:18556}}
admission: {{batch: {{max_share: 1.0, leave_for_higher: null}}}}
pools:
  chat:
    models: [m1]
    endpoints: [127.0.0.1:9001, 127.0.0.1:9002]
    capacity: {{max_running_requests: 1}}
    priority_scheduling: {scheduling}
gateways:
  edge:
    routes:
      - {{name: llm, pool: chat, match: {{prefix: /v1/}}, filters: {{plugins: [admission, tokens]}}}}
"""

RANKS = Ranking(enabled=True, preemption_threshold=10, low_values_first=False)
OFF = Ranking(enabled=False, preemption_threshold=10, low_values_first=False)


class World:
    def __init__(self, scheduling: str = "{enabled: true}") -> None:
        self.clock = FakeClock()
        self.policy = load_policy_text(POLICY.format(scheduling=scheduling))
        reader = pool_state_reader(self.policy, self.clock)
        assert reader is not None
        self.reader: PoolStateReader = reader
        self.registry = CollectorRegistry()
        self.gates = Gates(
            clock=self.clock,
            wall=self.clock,
            registry=self.registry,
            ranking=ranking_source(reader),
        )
        self.gates.configure(self.policy)
        self.version = 0

    def publish(self, second: Ranking, *, second_stale: bool = False) -> None:
        self.version += 1
        replicas = {
            "127.0.0.1:9001": ReplicaState(0.5, ranking=RANKS),
            "127.0.0.1:9002": ReplicaState(
                2.0 if second_stale else 0.5, stale=second_stale, ranking=second
            ),
        }
        summary = PoolSummary(replicas, capacity_running=2)
        assert self.reader.accept(PoolState(self.version, 0.0, {"chat": summary}).to_json())

    def gate(self) -> PoolGate:
        g = self.gates.gate("chat")
        assert g is not None
        return g

    def ranked(self) -> float | None:
        return self.registry.get_sample_value("tokenweir_admission_ranked", {"pool": "chat"})


def offer(g: PoolGate, lane: str) -> Ticket:
    t = g.core.offer(g.clock(), lane, "t")
    assert not isinstance(t, Shed), t
    return t


def test_a_replica_without_priority_scheduling_ends_preemptive_admission(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = World()
    assert w.gate().core.preemptive and w.ranked() == 1  # no pool state yet: the policy's word
    w.publish(OFF)
    with caplog.at_level(logging.WARNING, "tokenweir.admission"):
        g = w.gate()
        for _ in range(5):
            w.gate()
    assert not g.core.preemptive and w.ranked() == 0
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1  # once per change, not per request
    assert "chat" in warnings[0] and "127.0.0.1:9002" in warnings[0]
    assert "--enable-priority-scheduling" in warnings[0]
    assert [offer(g, "batch").state for _ in range(2)] == ["admitted"] * 2  # the pool is full
    assert offer(g, "interactive").state == "queued"  # waits at the gateway, as unranked


def test_it_comes_back_when_the_replica_ranks_or_goes_quiet() -> None:
    w = World()
    w.publish(OFF)
    assert not w.gate().core.preemptive
    w.publish(RANKS)
    g = w.gate()
    assert g.core.preemptive and w.ranked() == 1
    assert [offer(g, "batch").state for _ in range(2)] == ["admitted"] * 2
    assert offer(g, "interactive").state == "admitted"  # past the slots batch holds
    w.publish(OFF)
    assert not w.gate().core.preemptive
    w.publish(OFF, second_stale=True)  # the replica that differs no longer answers
    assert w.gate().core.preemptive


def test_unknown_keeps_the_policys_word() -> None:
    w = World()
    w.publish(Ranking())  # an older SGLang that does not report it
    assert w.gate().core.preemptive
    w.publish(OFF)
    assert not w.gate().core.preemptive
    w.clock.now += 60  # the control plane went silent: the pool state is stale
    assert w.gate().core.preemptive


def test_a_different_threshold_or_order_also_ends_it() -> None:
    w = World()
    w.publish(Ranking(enabled=True, preemption_threshold=1000))
    assert not w.gate().core.preemptive
    w.publish(Ranking(enabled=True, low_values_first=True))
    assert not w.gate().core.preemptive and w.gate().unranked is not None


def test_a_pool_that_does_not_declare_it_is_never_preemptive() -> None:
    w = World("{enabled: false}")
    w.publish(RANKS)
    assert not w.gate().core.preemptive and w.ranked() == 0


def test_a_reload_keeps_the_check() -> None:
    w = World()
    w.publish(OFF)
    assert not w.gate().core.preemptive
    w.gates.configure(load_policy_text(POLICY.format(scheduling="{enabled: true}")))
    assert not w.gate().core.preemptive and w.ranked() == 0
