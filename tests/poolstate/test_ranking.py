"""Whether a pool's replicas schedule by priority as the policy declares, and the ``rank`` field
of the pool-state JSON (an older control plane's JSON, without it, still decodes)."""

from __future__ import annotations

import json

import pytest

from policy.scheduling import PriorityScheduling
from poolstate import (
    PoolState,
    PoolStateDecodeError,
    PoolSummary,
    Ranking,
    ReplicaState,
    pool_mismatch,
    replica_mismatch,
)

ON = PriorityScheduling(enabled=True)
AS_SGLANG = Ranking(enabled=True, preemption_threshold=10, low_values_first=False)


def test_a_replica_that_matches_or_does_not_say_is_trusted() -> None:
    assert replica_mismatch(AS_SGLANG, ON) is None
    assert replica_mismatch(Ranking(), ON) is None  # an older SGLang: unknown, not false
    assert replica_mismatch(Ranking(enabled=True), ON) is None
    assert replica_mismatch(Ranking(enabled=True, preempts=True), ON) is None


def test_what_differs_is_named_in_sglangs_flags() -> None:
    off = Ranking(enabled=False, preemption_threshold=10, low_values_first=False)
    assert replica_mismatch(off, ON) == "runs without --enable-priority-scheduling"
    thr = replica_mismatch(Ranking(enabled=True, preemption_threshold=200), ON)
    assert thr == "has --priority-scheduling-preemption-threshold 200, the policy 10"
    low = replica_mismatch(Ranking(enabled=True, low_values_first=True), ON)
    assert low is not None and "--schedule-low-priority-values-first" in low
    high = replica_mismatch(
        Ranking(enabled=True, low_values_first=False),
        PriorityScheduling(enabled=True, low_values_first=True),
    )
    assert high is not None and "high values first" in high
    nopre = replica_mismatch(Ranking(enabled=True, preempts=False), ON)
    assert nopre == "runs with --disable-priority-preemption"


def test_a_pool_that_does_not_declare_priority_scheduling_has_nothing_to_contradict() -> None:
    assert replica_mismatch(Ranking(enabled=False), PriorityScheduling()) is None


def test_the_pool_reads_only_answering_replicas_and_names_the_first_that_differs() -> None:
    off = Ranking(enabled=False)
    replicas = {
        "10.0.0.2:1": ReplicaState(0.5, ranking=off),
        "10.0.0.1:1": ReplicaState(0.5, ranking=AS_SGLANG),
        "10.0.0.3:1": ReplicaState(0.5, ranking=off),
    }
    why = pool_mismatch(replicas, ON)
    assert why == "10.0.0.2:1: runs without --enable-priority-scheduling (and 1 more replicas)"
    quiet = {
        "dead": ReplicaState(2.0, healthy=False, stale=True, ranking=off),
        "silent": ReplicaState(0.5, healthy=False, ranking=off),  # its last scrape failed
        "good": ReplicaState(0.5, ranking=AS_SGLANG),
    }
    assert pool_mismatch(quiet, ON) is None
    assert pool_mismatch({}, ON) is None


def test_the_rank_field_round_trips_and_is_left_out_when_unknown() -> None:
    known = ReplicaState(0.5, ranking=Ranking(True, 10, False, None))
    summary = PoolSummary({"a:1": known, "b:1": ReplicaState(0.2)}, capacity_running=4)
    doc = json.loads(json.dumps(PoolState(3, 1.0, {"chat": summary}).to_json()))
    eps = doc["pools"]["chat"]["endpoints"]
    assert eps["a:1"]["rank"] == {"on": True, "thr": 10, "low": False}
    assert "rank" not in eps["b:1"]
    back = PoolState.from_json(doc).pools["chat"].endpoints
    assert back["a:1"].ranking == known.ranking and back["b:1"].ranking == Ranking()
    assert PoolState.from_json(doc).to_json() == doc


def test_an_older_control_planes_json_decodes_as_unknown() -> None:
    old = {
        "version": 7,
        "ts": 1764554000.25,
        "pools": {
            "chat": {
                "saturation": 0.41,
                "capacity_running": 96,
                "capacity_queued": 0,
                "endpoints": {
                    "127.0.0.1:30001": {
                        "s": 0.41, "run": 14, "q": 0, "kv": 0.22, "tput": 812.5, "hit": 0.37,
                        "ok": True, "stale": False, "deg": False, "age": 0.12,
                    }
                },
            }
        },
    }  # fmt: skip
    replica = PoolState.from_json(old).pools["chat"].endpoints["127.0.0.1:30001"]
    assert replica.ranking == Ranking() and not replica.ranking.known


@pytest.mark.parametrize(
    "rank", [[], {"on": "yes"}, {"thr": 1.5}, {"thr": True}, {"low": 1}, {"pre": "no"}]
)
def test_a_malformed_rank_is_rejected_with_its_key(rank: object) -> None:
    doc = ReplicaState(0.1).to_json() | {"rank": rank}
    with pytest.raises(PoolStateDecodeError, match="rank"):
        ReplicaState.from_json(doc)
