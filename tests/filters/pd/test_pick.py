"""The PD pair choice: prefix affinity bounded by backlog; decode by KV held and batch."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from filters.plugins.pd.hub import PdHub
from filters.plugins.pd.pick import pick_decode, pick_prefill, rendezvous_order
from policy.common import Address
from policy.disaggregation import Disaggregation, PrefillReplica

REPLICAS = ["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"]


def test_same_prefix_same_prefill_while_its_backlog_is_bounded() -> None:
    key = b"system prompt of tenant a"
    first = pick_prefill(key, REPLICAS, {}, 100)
    assert all(pick_prefill(key, REPLICAS, {first: 100}, 100) == first for _ in range(3))
    # far over the mean: the next replica in hash order takes it
    busy = {first: 10_000}
    assert pick_prefill(key, REPLICAS, busy, 100) == rendezvous_order(key, REPLICAS)[1]
    # an ejected replica is skipped, unless all are
    assert pick_prefill(key, REPLICAS, {}, 100, ejected=frozenset({first})) != first
    assert pick_prefill(key, REPLICAS, {}, 100, ejected=frozenset(REPLICAS)) == first


@given(st.lists(st.binary(min_size=1, max_size=16), min_size=50, max_size=50, unique=True))
def test_distinct_prefixes_spread(keys: list[bytes]) -> None:
    picks = [pick_prefill(k, REPLICAS, {}, 1) for k in keys]
    assert len(set(picks)) >= 2


def test_decode_goes_where_the_least_kv_is_held() -> None:
    assert pick_decode(REPLICAS, {REPLICAS[0]: 10, REPLICAS[1]: 5, REPLICAS[2]: 5},
                       {REPLICAS[1]: 3, REPLICAS[2]: 1}) == REPLICAS[2]  # fmt: skip


def test_hub_counts_a_request_in_and_out_of_both_replicas() -> None:
    pd = Disaggregation(
        prefill=(PrefillReplica(Address("10.0.0.1", 30000), 9000),),
        decode=(Address("10.0.0.2", 30000), Address("10.0.0.3", 30000)),
    )
    hub = PdHub(CollectorRegistry(), clock=lambda: 0.0, rng=random.Random(1))
    a = hub.start("chat", pd, b"x", 100, 150)
    b = hub.start("chat", pd, b"x", 100, 150)
    assert a.decode != b.decode  # the second goes where less KV is held
    assert a.room != b.room and 0 <= a.room < 2**63
    assert hub.backlog["10.0.0.1:30000"] == 200
    assert hub.bootstrap_port(pd, a.prefill) == 9000
    a.decode_status = 200
    assert hub.finish(a) == "ok"
    assert hub.finish(b) == "decode_failed"  # no decode status: it never answered
    assert hub.decode_tokens == {"10.0.0.2:30000": 0, "10.0.0.3:30000": 0}


def test_a_decode_replica_that_never_answered_is_ejected_a_while() -> None:
    pd = Disaggregation(
        prefill=(PrefillReplica(Address("10.0.0.1", 30000)),),
        decode=(Address("10.0.0.2", 30000), Address("10.0.0.3", 30000)),
        eject_for=5.0,
    )
    now = [0.0]
    hub = PdHub(CollectorRegistry(), clock=lambda: now[0], rng=random.Random(1))
    dead = hub.start("chat", pd, b"x", 10, 10)
    assert hub.finish(dead) == "decode_failed"  # refused: no response headers came
    # the dead one holds nothing now, yet the next requests go to the other one
    assert all(hub.start("chat", pd, b"x", 10, 10).decode != dead.decode for _ in range(3))
    now[0] = 6.0
    assert hub.start("chat", pd, b"x", 0, 0).decode == dead.decode  # back after eject_for
    # a 500 from the decode side whose prefill failed ejects no decode replica
    f = hub.start("chat", pd, b"x", 0, 0)
    f.prefill_error, f.decode_status = "HTTP 500", 500
    assert hub.finish(f) == "prefill_failed"
    other = next(a for a in ("10.0.0.2:30000", "10.0.0.3:30000") if a != f.decode)
    hub.decode_tokens = {f.decode: 0, other: 100}  # f's replica is the least loaded
    assert hub.start("chat", pd, b"x", 0, 0).decode == f.decode  # and not ejected
