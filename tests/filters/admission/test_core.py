"""The pure admission core: bounds, strict priority, weighted fairness, shedding, drain rate."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filters.plugins.admission.core import Admission, LaneConfig, Shed
from filters.plugins.admission.drain import DrainMeter
from filters.plugins.admission.queues import Ticket

LANES = ("interactive", "batch")


def admission(
    cap: int | None = 4,
    *,
    queue: int = 8,
    per_tenant: int = 4,
    wait: float = 5.0,
    batch_share: float = 1.0,
    tokens: int | None = None,
    leave: float | None = None,
) -> Admission:
    return Admission(
        [
            LaneConfig("interactive", queue, per_tenant, wait),
            LaneConfig("batch", queue, per_tenant, wait * 10, batch_share, leave),
        ],
        max_requests=cap,
        max_tokens=tokens,
    )


def ticket(x: Ticket | Shed) -> Ticket:
    assert isinstance(x, Ticket), x
    return x


def check_invariants(a: Admission, now: float) -> None:
    for name, q in a.queues.items():
        assert len(q) <= a.lanes[name].max_queue
        assert all(n <= a.lanes[name].max_queue_per_tenant for n in q.tenants().values())
    if a.max_tokens is not None and a.in_flight > 1:
        assert a.in_flight_tokens <= a.max_tokens
    if a.max_requests is not None:
        assert a.in_flight <= a.max_requests
        for name, n in a.lane_in_flight.items():
            assert n <= max(1, math.floor(a.max_requests * a.lanes[name].max_share))
    # work conserving with strict priority: the first lane with waiters cannot start its head
    for name in a.order:
        q = a.queues[name]
        if len(q):
            head = q.peek()
            assert head is not None and not a._fits(head, now)
            break


ops = st.lists(
    st.tuples(
        st.sampled_from(["offer", "offer", "release", "drop", "tick", "sweep"]),
        st.sampled_from(LANES),
        st.sampled_from(["t1", "t2", "t3"]),
        st.integers(0, 1000),
    ),
    max_size=120,
)


@settings(max_examples=200, deadline=None)
@given(
    ops,
    st.integers(1, 6),
    st.floats(0.1, 1.0),
    st.sampled_from([None, 60, 100]),
    st.sampled_from([None, 0.0, 0.25]),
)
def test_bounds_and_strict_priority_hold_under_any_sequence(
    seq: list[tuple[str, str, str, int]],
    cap: int,
    share: float,
    max_tokens: int | None,
    leave: float | None,
) -> None:
    a = admission(cap, queue=6, per_tenant=3, batch_share=share, tokens=max_tokens, leave=leave)
    now = 0.0
    admitted: list[Ticket] = []
    queued: list[Ticket] = []
    for op, lane, tenant, pick in seq:
        now += 0.01
        # the gate pumps on every request it sees (a higher lane's reserve fades with time)
        woken = a.pump(now)
        admitted += woken
        queued = [q for q in queued if q.state == "queued"]
        if op == "offer":
            had_higher = any(len(a.queues[n]) for n in a.order[: a.order.index(lane)])
            r = a.offer(now, lane, tenant, weight=1 + pick % 3, tokens=pick % 50)
            if isinstance(r, Ticket):
                if r.state == "admitted":
                    assert not had_higher, "a lower lane overtook a waiting higher lane"
                    admitted.append(r)
                else:
                    queued.append(r)
            else:
                assert r.status in (503, 504) and r.retry_after > 0
        elif op == "release" and admitted:
            before = {n: len(a.queues[n]) for n in a.order}
            fits_interactive = [
                t for t in queued if t.lane == "interactive" and t.state == "queued"
            ]
            t = admitted.pop(pick % len(admitted))
            started = a.release(now, t)
            lanes = [a.order.index(x.lane) for x in started]
            assert lanes == sorted(lanes), "released out of priority order"
            for x in started:
                higher = a.order[: a.order.index(x.lane)]
                assert all(len(a.queues[n]) == 0 for n in higher)
            if fits_interactive and before["interactive"]:
                assert (started and started[0].lane == "interactive") or not a._fits(
                    a.queues["interactive"].peek(),  # type: ignore[arg-type]
                    now,
                )
            admitted += started
            queued = [q for q in queued if q.state == "queued"]
        elif op == "drop" and queued:
            t = queued.pop(pick % len(queued))
            shed, started = a.drop(now, t)
            assert shed is not None and shed.status == 503
            admitted += started
            queued = [q for q in queued if q.state == "queued"]
        elif op == "tick":
            now += pick / 100
            admitted += a.pump(now)
            queued = [q for q in queued if q.state == "queued"]
        elif op == "sweep":
            now += pick / 100
            admitted += a.pump(now)
            for t, shed in a.sweep(now):
                assert t in queued and t.state == "dropped"
                assert all(t not in a.queues[n].all() for n in a.order)
                assert shed.status in (503, 504) and shed.retry_after > 0
                assert shed.reason in ("fell_behind", "deadline")
            admitted += a.pump(now)
            queued = [q for q in queued if q.state == "queued"]
        check_invariants(a, now)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 5), st.integers(1, 5), st.integers(1, 30))
def test_tenants_share_a_lane_by_weight(wa: int, wb: int, grants: int) -> None:
    a = admission(1, queue=200, per_tenant=100)
    first = ticket(a.offer(0.0, "batch", "x"))
    for _ in range(60):
        a.offer(0.0, "batch", "a", weight=wa)
        a.offer(0.0, "batch", "b", weight=wb)
    served = {"a": 0, "b": 0}
    running = first
    for i in range(grants):
        # no usage metered: each request settles what it was expected to cost (the plugin)
        (running,) = a.release(1.0 + i, running, running.charge)
        served[running.tenant] += 1
        # start-time fair queueing: normalised service never drifts more than one request apart
        assert abs(served["a"] / wa - served["b"] / wb) <= 1 / wa + 1 / wb + 1e-9


@given(st.integers(1, 50))
def test_one_tenant_cannot_fill_a_lane(n: int) -> None:
    a = admission(1, queue=8, per_tenant=4)
    ticket(a.offer(0.0, "batch", "hog"))
    sheds = [r for r in (a.offer(0.0, "batch", "hog") for _ in range(n)) if isinstance(r, Shed)]
    assert len(a.queues["batch"]) == min(n, 4)
    assert all(s.reason == "tenant_queue_full" for s in sheds)
    assert ticket(a.offer(0.0, "batch", "other")).state == "queued"


def test_interactive_is_not_starved_by_a_batch_backlog() -> None:
    a = admission(2, queue=100, per_tenant=100)
    running = [ticket(a.offer(0.0, "batch", "b")) for _ in range(2)]
    for _ in range(50):
        a.offer(0.0, "batch", "b")
    i = ticket(a.offer(0.1, "interactive", "i"))
    assert i.state == "queued"
    assert a.release(0.2, running[0]) == [i]  # the very next slot, ahead of 50 batch


def test_batch_share_keeps_room_for_interactive() -> None:
    a = admission(4, batch_share=0.5)
    assert [ticket(a.offer(0.0, "batch", "b")).state for _ in range(3)] == [
        "admitted",
        "admitted",
        "queued",
    ]
    assert ticket(a.offer(0.0, "interactive", "i")).state == "admitted"


def test_full_queue_is_shed_at_once_with_retry_after_from_the_drain_rate() -> None:
    a = admission(1, queue=2, per_tenant=2)
    running = ticket(a.offer(0.0, "interactive", "a"))
    for i in range(10):  # ten completions in one second: 10 requests/s measured
        (running,) = a.release(0.1 * (i + 1), running) or (
            ticket(a.offer(0.1 * (i + 1), "interactive", "a")),
        )
    a.offer(1.0, "interactive", "a")
    a.offer(1.0, "interactive", "b")
    shed = a.offer(1.0, "interactive", "c")
    assert isinstance(shed, Shed) and (shed.status, shed.reason) == (503, "queue_full")
    assert shed.retry_after == 3 / a.drain_rate(1.0, "interactive")  # type: ignore[operator]


def measured(rate: float, **kw: int) -> Admission:
    """One slot, ``rate`` completions per second measured for a second."""
    a = admission(1, **kw)
    running = ticket(a.offer(0.0, "interactive", "a"))
    for i in range(int(rate)):
        now = (i + 1) / rate
        a.release(now, running)
        running = ticket(a.offer(now, "interactive", "a"))
    return a


def test_each_client_shed_in_a_burst_is_told_a_later_time() -> None:
    a = measured(10.0, queue=2, per_tenant=2)
    a.offer(1.0, "interactive", "a")
    a.offer(1.0, "interactive", "b")
    waits = []
    for who in "cdefg":
        shed = a.offer(1.0, "interactive", who)
        assert isinstance(shed, Shed) and shed.reason == "queue_full"
        waits.append(shed.retry_after)
    rate = a.drain_rate(1.0, "interactive")
    assert rate is not None
    # the k-th client shed is told the time for the queue (2) and the k told before it
    assert waits == [pytest.approx((3 + k) / rate) for k in range(5)]
    # once a promised time has come, it no longer pushes later clients back
    later = a.offer(1.0 + waits[-1] + 0.01, "interactive", "h")
    assert isinstance(later, Shed) and later.retry_after < waits[-1]


def test_told_waits_are_jittered_within_a_tenth() -> None:
    a = measured(10.0, queue=0, per_tenant=1)
    a.rng = random.Random(7)
    told = [a.retry_after(1.0, "interactive") for _ in range(50)]
    bare = [(1 + k) / a.drain_rate(1.0, "interactive") for k in range(50)]  # type: ignore[operator]
    assert all(b <= t <= b * 1.1 for b, t in zip(bare, told, strict=True))
    assert len({round(t / b, 6) for b, t in zip(bare, told, strict=True)}) > 1


def test_retry_after_follows_the_measured_rate() -> None:
    def shed_after(step: float) -> Shed:
        a = admission(1, queue=1, per_tenant=1)
        running = ticket(a.offer(0.0, "interactive", "a"))
        now = 0.0
        for _ in range(6):
            now += step
            a.release(now, running)
            running = ticket(a.offer(now, "interactive", "a"))
        a.offer(now, "interactive", "b")
        shed = a.offer(now, "interactive", "c")
        assert isinstance(shed, Shed)
        return shed

    fast, slow = shed_after(0.1), shed_after(1.0)
    assert slow.retry_after > 5 * fast.retry_after
    assert slow.retry_after_s >= 2 and fast.retry_after_s == 1


def test_a_wait_longer_than_the_lane_allows_is_shed_at_once() -> None:
    a = admission(1, queue=100, per_tenant=100, wait=0.5)
    running = ticket(a.offer(0.0, "interactive", "a"))
    now = 0.0
    for _ in range(4):  # one completion per second measured
        now += 1.0
        a.release(now, running)
        running = ticket(a.offer(now, "interactive", "a"))
    r = a.offer(now, "interactive", "b")  # one ahead at 1/s: 1 s > 0.5 s
    assert isinstance(r, Shed) and (r.status, r.reason) == (503, "wait_too_long")


def test_deadlines_shorten_the_wait_and_never_reorder() -> None:
    a = admission(1)
    running = ticket(a.offer(0.0, "interactive", "a"))
    late = a.offer(1.0, "interactive", "b", deadline=1.0)
    assert isinstance(late, Shed) and late.status == 504
    slow = ticket(a.offer(1.0, "interactive", "a"))
    urgent = ticket(a.offer(1.0, "interactive", "a", deadline=1.5))
    assert urgent.start_by == 1.5
    assert a.release(1.2, running) == [slow]  # a deadline does not jump the queue
    shed, _ = a.drop(2.0, urgent)
    assert shed is not None and (shed.status, shed.reason) == (504, "deadline")


def test_tokens_in_flight_are_bounded() -> None:
    a = admission(10, tokens=100)
    big = ticket(a.offer(0.0, "interactive", "a", tokens=80))
    assert ticket(a.offer(0.0, "interactive", "a", tokens=30)).state == "queued"
    assert [t.tokens for t in a.release(1.0, big)] == [30]
    alone = admission(10, tokens=100)
    assert ticket(alone.offer(0.0, "interactive", "a", tokens=500)).state == "admitted"


def test_lower_capacity_from_pool_state_admits_less() -> None:
    a = admission(4)
    ts = [ticket(a.offer(0.0, "interactive", "a")) for _ in range(4)]
    assert a.set_capacity(0.0, 2, None) == []
    for t in ts[:3]:
        assert a.release(1.0, t) == [] or a.in_flight <= 2
    assert a.in_flight == 1


def test_an_aborted_waiter_leaves_the_queue_and_an_aborted_runner_frees_its_slot() -> None:
    a = admission(1)
    running = ticket(a.offer(0.0, "interactive", "a"))
    waiting = ticket(a.offer(0.0, "interactive", "b"))
    assert a.release(0.1, waiting) == [] and len(a.queues["interactive"]) == 0
    assert a.drop(0.2, running) == (None, []) and a.in_flight == 0


def test_drain_meter_measures_events_in_its_window() -> None:
    m = DrainMeter(window=10.0)
    assert m.rate(0.0) is None
    for i in range(20):
        m.record(i * 0.5)
    assert m.rate(10.0) == 2.0
    assert m.rate(100.0) is None


def test_a_newcomer_that_fits_starts_when_the_old_head_does_not() -> None:
    """Found by hypothesis: tenant fairness makes a new tenant's ticket the head of a lane whose
    old head is too large for the token budget; the newcomer fits and must start at once."""
    a = admission(3, queue=6, per_tenant=3, tokens=60)
    first = ticket(a.offer(0.0, "interactive", "t1", tokens=12))
    ticket(a.offer(0.0, "interactive", "t1", tokens=8))
    big = ticket(a.offer(0.0, "interactive", "t1", tokens=41))
    last = ticket(a.offer(0.0, "interactive", "t1", tokens=12))
    assert (big.state, last.state) == ("queued", "queued")
    assert a.release(0.1, first) == [big]  # 8 + 41 in flight; 12 more would pass 60
    newcomer = ticket(a.offer(0.2, "interactive", "t2", tokens=0))
    assert newcomer.state == "admitted"
    assert last.state == "queued"
