"""Pool state → admission: fresh saturation lowers the limit; a silent control plane does not."""

from __future__ import annotations

from filters.plugins.admission.gate import Gates
from filters.plugins.admission.signal import (
    admission_saturation,
    admission_source,
    pool_state_reader,
    saturation_source,
)
from policy import load_policy_text
from poolstate.state import PoolState, PoolSummary, ReplicaState
from tests.filters.conftest import FakeClock

POLICY = """
version: 1
control_plane: {{metrics: 127.0.0.1:18555}}
filters: {{address: 127.0.0.1:18556}}
admission: {{pool_state: {use}}}
pools:
  chat: {{models: [m1], endpoints: [127.0.0.1:9001], capacity: {{max_running_requests: 10}}}}
gateways:
  edge:
    routes:
      - {{name: llm, pool: chat, match: {{prefix: /v1/}}, filters: {{plugins: [{plugins}]}}}}
"""


def state(version: int, saturation: float) -> dict[str, object]:
    replica = ReplicaState(saturation=saturation, running=10)
    summary = PoolSummary({"127.0.0.1:9001": replica}, capacity_running=10)
    return PoolState(version, 0.0, {"chat": summary}).to_json()


def test_fresh_saturation_lowers_admission_and_a_silent_control_plane_does_not() -> None:
    clock = FakeClock()
    policy = load_policy_text(POLICY.format(use="true", plugins="admission"))
    reader = pool_state_reader(policy, clock)
    assert reader is not None and reader.url == "http://127.0.0.1:18555/api/v1/pools"
    gates = Gates(clock=clock, wall=clock, saturation=saturation_source(reader))
    gates.configure(policy)

    def limit() -> int | None:
        gate = gates.gate("chat")
        assert gate is not None
        return gate.core.max_requests

    assert limit() == 10  # nothing heard yet: the policy's capacity
    assert reader.accept(state(1, 1.5))
    assert limit() == 5
    assert reader.accept(state(2, 0.7))
    assert limit() == 10
    assert reader.accept(state(3, 1.8))
    clock.now += 60  # the control plane went silent: back to the policy's bound, not 1
    assert limit() == 10


def test_no_reader_without_admission_or_when_switched_off() -> None:
    clock = FakeClock()
    assert (
        pool_state_reader(load_policy_text(POLICY.format(use="true", plugins="identity")), clock)
        is None
    )
    assert (
        pool_state_reader(load_policy_text(POLICY.format(use="false", plugins="admission")), clock)
        is None
    )


def test_admission_accounts_per_replica() -> None:
    """A queue on one replica lowers admission though the pool's mean saturation is below 1
    (the other replica idles): the limit is what each replica can still take."""
    clock = FakeClock()
    policy = load_policy_text(POLICY.format(use="true", plugins="admission"))
    reader = pool_state_reader(policy, clock)
    assert reader is not None
    gates = Gates(clock=clock, wall=clock, saturation=admission_source(reader))
    gates.configure(policy)
    hot = ReplicaState(saturation=1.5, running=10, queued=5)
    idle = ReplicaState(saturation=0.3, running=3)
    summary = PoolSummary({"a": hot, "b": idle}, capacity_running=20)
    assert summary.saturation < 1.0  # the mean hides the queue
    assert reader.accept(PoolState(1, 0.0, {"chat": summary}).to_json())
    gate = gates.gate("chat")
    assert gate is not None and gate.core.max_requests == 7  # 10 x (0.5 + 1) / 2
    assert saturation_source(reader)("chat") == summary.saturation  # the ladder's: the mean


def test_admission_saturation_is_the_mean_share_each_replica_offers() -> None:
    assert admission_saturation([]) is None
    assert admission_saturation([0.2, 0.9]) == 1.0  # no replica over: no reduction
    assert admission_saturation([3.0, 3.0]) == 2.0  # nothing offered: the floor (1 request)
    assert admission_saturation([1.5]) == 1.5  # one replica: its own saturation
