"""Admission in front of a preemptive pool (the backends schedule by request priority and
preempt running lower-priority requests): the lanes above the lowest count only their own and
the higher lanes' slots; the lowest lane counts every slot."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from filters.plugins.admission.core import Admission, LaneConfig, Shed
from filters.plugins.admission.gate import AdmissionMetrics, PoolGate
from filters.plugins.admission.queues import Ticket
from filters.plugins.admission.signal import admission_alive


def pool(cap: int = 4, *, tokens: int | None = None, preemptive: bool = True) -> Admission:
    a = Admission(
        [
            LaneConfig("interactive", 8, 8, 5.0),
            LaneConfig("batch", 8, 8, 50.0, 1.0, None),
        ],
        max_requests=cap,
        max_tokens=tokens,
    )
    a.preemptive = preemptive
    a.preempt_limit = cap
    return a


def ticket(x: Ticket | Shed) -> Ticket:
    assert isinstance(x, Ticket), x
    return x


def test_interactive_starts_at_once_while_batch_holds_every_slot() -> None:
    a = pool(4)
    for i in range(4):
        assert ticket(a.offer(0.0, "batch", f"b{i}")).state == "admitted"
    t = ticket(a.offer(0.1, "interactive", "i"))
    assert t.state == "admitted"
    assert a.in_flight == 5  # the backend preempts one batch request for it


def test_the_same_burst_waits_on_a_pool_that_does_not_preempt() -> None:
    a = pool(4, preemptive=False)
    for i in range(4):
        ticket(a.offer(0.0, "batch", f"b{i}"))
    assert ticket(a.offer(0.1, "interactive", "i")).state == "queued"


def test_interactive_still_waits_for_interactive() -> None:
    a = pool(2)
    first = [ticket(a.offer(0.0, "interactive", f"i{i}")) for i in range(2)]
    third = ticket(a.offer(0.0, "interactive", "i3"))
    assert third.state == "queued"
    assert a.release(1.0, first[0]) == [third]


def test_batch_counts_every_slot_and_waits_behind_preempting_interactive() -> None:
    a = pool(2)
    i = [ticket(a.offer(0.0, "interactive", f"i{n}")) for n in range(2)]
    b = ticket(a.offer(0.0, "batch", "b"))
    assert b.state == "queued"
    assert a.release(1.0, i[0]) == [b]


def test_batch_does_not_start_while_preempted_batch_still_counts() -> None:
    a = pool(2)
    b = [ticket(a.offer(0.0, "batch", f"b{n}")) for n in range(2)]
    i = ticket(a.offer(0.0, "interactive", "i"))
    assert i.state == "admitted"
    late = ticket(a.offer(0.1, "batch", "late"))
    assert late.state == "queued"  # 3 in flight against 2: the pool is over, batch waits
    assert a.release(1.0, b[0]) == []  # still 2 in flight
    assert a.release(1.1, i) == [late]


def test_the_preempting_lane_keeps_the_declared_limit_when_saturation_lowers_it() -> None:
    a = pool(4)
    for n in range(4):
        ticket(a.offer(0.0, "batch", f"b{n}"))
    a.set_capacity(0.0, 1, None)  # saturated: the backends' queues hold preempted batch
    started = [ticket(a.offer(0.1, "interactive", f"i{n}")) for n in range(5)]
    assert [t.state for t in started] == ["admitted"] * 4 + ["queued"]
    assert ticket(a.offer(0.2, "batch", "b")).state == "queued"


def test_tokens_count_the_preempting_lanes_only() -> None:
    a = pool(10, tokens=100)
    ticket(a.offer(0.0, "batch", "b", tokens=90))
    assert ticket(a.offer(0.0, "interactive", "i", tokens=60)).state == "admitted"
    assert ticket(a.offer(0.0, "interactive", "j", tokens=60)).state == "queued"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["offer_i", "offer_b", "release"]), st.integers(0, 50)),
        max_size=80,
    )
)
def test_preempting_lanes_never_hold_more_than_the_limit(ops: list[tuple[str, int]]) -> None:
    a = pool(3)
    running: list[Ticket] = []
    now = 0.0
    for op, k in ops:
        now += 0.01
        if op == "release":
            if running:
                t = running.pop(k % len(running))
                a.release(now, t)
        else:
            lane = "interactive" if op == "offer_i" else "batch"
            r = a.offer(now, lane, f"t{k % 3}")
            if isinstance(r, Ticket):
                running.append(r)
        running = [t for t in running if t.state in ("admitted", "queued")]
        assert a.lane_in_flight["interactive"] <= 3
        # batch starts only below the limit: every batch start found the pool under it
        assert a.lane_in_flight["batch"] <= 3
        q = a.queues["interactive"]
        if len(q):  # work conserving: a waiting interactive head cannot start
            head = q.peek()
            assert head is not None and a.lane_in_flight["interactive"] >= 3


async def test_a_dead_replica_lowers_the_preempting_lanes_limit_a_queue_does_not() -> None:
    a = pool(4)
    ticks = itertools.count()
    gate = PoolGate(
        "chat", a, clock=lambda: float(next(ticks)), metrics=AdmissionMetrics(CollectorRegistry())
    )
    # two replicas answer, their queues full of preempted batch (saturation 2): batch is
    # lowered, interactive keeps the declared limit
    gate.observe(2.0, admission_alive([(True, False), (True, False)]))
    assert a.preempt_limit == 4 and a.max_requests is not None and a.max_requests < 4
    gate.observe(2.0, admission_alive([(True, False), (False, False)]))  # one is dead
    assert a.preempt_limit == 2
    gate.observe(None, admission_alive([(True, True), (False, False)]))  # none answers
    assert a.preempt_limit == 1
    gate.observe(None, None)  # no pool state: the declared limit
    assert a.preempt_limit == 4
    assert admission_alive([]) is None
