"""The reader services run: keeps the last state; silence of the control plane reads stale."""

from __future__ import annotations

from poolstate import SATURATED, PoolState, ReplicaState, summarize_pool
from poolstate.reader import PoolStateReader, mark_stale, pools_url


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def doc(version: int, saturation: float = 0.3) -> dict[str, object]:
    pool = summarize_pool({"127.0.0.1:1": ReplicaState(saturation, running=3)}, {})
    return PoolState(version, 1.0, {"chat": pool}).to_json()


def test_before_any_answer_the_reader_is_stale_and_empty() -> None:
    r = PoolStateReader("http://127.0.0.1:1/api/v1/pools", clock=Clock())
    assert r.stale and r.state.pools == {}


def test_keeps_the_last_state_and_marks_it_stale_when_the_control_plane_goes_silent() -> None:
    clock = Clock()
    r = PoolStateReader(pools_url("127.0.0.1", 18001), clock=clock, stale_after_s=2.0)
    assert r.accept(doc(4))
    assert not r.stale and r.state.pools["chat"].endpoints["127.0.0.1:1"].saturation == 0.3
    clock.t = 1.9
    assert r.accept(doc(4))  # a long poll that timed out: same version, still alive
    clock.t = 3.8
    assert not r.stale
    clock.t = 4.0
    rep = r.state.pools["chat"].endpoints["127.0.0.1:1"]
    assert r.stale and rep.stale and rep.saturation == SATURATED and r.state.version == 4


def test_a_reader_cannot_be_built_to_call_a_quiet_long_poll_stale() -> None:
    import pytest

    with pytest.raises(ValueError):
        PoolStateReader("http://x/api/v1/pools", clock=Clock(), stale_after_s=1, poll_timeout_s=1)
    r = PoolStateReader("http://x/api/v1/pools", clock=Clock())
    assert r.stale_after_s > r.poll_timeout_s


def test_a_malformed_answer_is_rejected_and_the_last_state_serves() -> None:
    clock = Clock()
    r = PoolStateReader("http://x/api/v1/pools", clock=clock)
    r.accept(doc(2))
    assert not r.accept({"version": "three"})
    assert r.state.version == 2


def test_mark_stale_keeps_version_and_counts() -> None:
    s = PoolState.from_json(doc(9))
    m = mark_stale(s)
    assert m.version == 9 and m.pools["chat"].endpoints["127.0.0.1:1"].running == 3
    assert m.pools["chat"].saturation == SATURATED
