"""The pure admission core, the higher lanes' reserve: batch leaves the slots interactive is
measured to need, a batch ticket the reserve blocks is shed at offer, queued tickets that can no
longer start in time are swept, and the forecast reads the lane's room (issue 10)."""

from __future__ import annotations

import math

import pytest

from filters.plugins.admission.core import Admission, LaneConfig, Shed
from filters.plugins.admission.queues import Ticket
from tests.filters.admission.test_core import admission, ticket


def _measured_interactive(a: Admission, *, rate: float, hold: float, until: float) -> float:
    """Interactive requests offered at ``rate``/s, each released after ``hold`` seconds."""
    now, running = 0.0, []
    while now < until:
        running.append((now + hold, ticket(a.offer(now, "interactive", "i"))))
        now += 1.0 / rate
        for end, t in [x for x in running if x[0] <= now]:
            a.release(end, t)
            running.remove((end, t))
    for _, t in running:  # everything ends: only the measurement stays
        a.release(now, t)
    return now


def test_batch_leaves_the_slots_interactive_is_measured_to_need() -> None:
    """Interactive offered at 4/s holding 1 s each needs 4 slots; with 25% headroom 5. On 8
    slots batch may then hold 3, though its max_share (1.0) would let it take all 8."""
    a = admission(8, queue=20, per_tenant=20, leave=0.25)
    now = _measured_interactive(a, rate=4.0, hold=1.0, until=5.0)
    assert a.in_flight == 0 and a.reserved_above(now, "batch") == 5
    started = [a.offer(now, "batch", "b") for _ in range(8)]
    assert [ticket(t).state for t in started].count("admitted") == 3
    # interactive arrivals find their slots free at once
    assert all(ticket(a.offer(now, "interactive", "i")).state == "admitted" for _ in range(5))


def test_without_leave_for_higher_batch_takes_every_slot_its_share_allows() -> None:
    a = admission(8, queue=20, per_tenant=20, leave=None)
    now = _measured_interactive(a, rate=4.0, hold=1.0, until=5.0)
    assert a.reserved_above(now, "batch") == 0
    started = [ticket(a.offer(now, "batch", "b")) for _ in range(8)]
    assert all(t.state == "admitted" for t in started)


def test_the_reserve_fades_when_interactive_stops_asking() -> None:
    a = admission(8, queue=20, per_tenant=20, leave=0.25)
    now = _measured_interactive(a, rate=4.0, hold=1.0, until=5.0)
    assert a.reserved_above(now + 30.0, "batch") == 0  # the window (10 s) saw no offer
    started = [ticket(a.offer(now + 30.0, "batch", "b")) for _ in range(8)]
    assert all(t.state == "admitted" for t in started)


def test_a_queued_batch_head_starts_on_an_empty_pool_whatever_is_reserved() -> None:
    """Nothing in flight would ever wake a batch ticket held back by the reserve: an empty
    pool starts it."""
    a = admission(2, queue=20, per_tenant=20, leave=1.0)
    now = _measured_interactive(a, rate=4.0, hold=1.0, until=5.0)
    assert a.reserved_above(now, "batch") == 2 and a.in_flight == 0
    first = ticket(a.offer(now, "batch", "b"))
    second = ticket(a.offer(now, "batch", "b"))
    assert (first.state, second.state) == ("admitted", "queued")


def test_interactive_held_slots_count_against_its_own_reserve() -> None:
    """Slots interactive already holds are part of what it needs: batch is kept out of the
    rest of the reserve only."""
    a = admission(8, queue=20, per_tenant=20, leave=0.0)
    now = _measured_interactive(a, rate=4.0, hold=1.0, until=5.0)
    held = [ticket(a.offer(now, "interactive", "i")) for _ in range(3)]
    assert all(t.state == "admitted" for t in held)
    need = math.ceil(a.demand["interactive"].slots(now))
    assert need > 3 and a.reserved_above(now, "batch") == need - 3  # what it does not hold
    started = [ticket(a.offer(now, "batch", "b")) for _ in range(8)]
    assert [t.state for t in started].count("admitted") == 8 - need


# -- the honest prediction: the lanes above, their reserve, the queued tickets' sweep ------------
def _run_batch(a: Admission, now: float, *, n: int = 3, hold: float = 1.0) -> float:
    """``n`` batch requests one after another, each holding its slot ``hold`` seconds: the
    batch lane's hold time and grant rate, and the pool's completions, are measured."""
    for _ in range(n):
        b = ticket(a.offer(now, "batch", "b"))
        assert b.state == "admitted"
        now += hold
        a.release(now, b)
    return now


def _interactive_wanting_every_slot() -> tuple[Admission, float, Ticket]:
    """8 slots; batch measured running; then interactive offered at 8/s holding 1 s each (it
    needs 8 slots, 10 with the 25% headroom); one interactive request still running."""
    a = admission(8, queue=20, per_tenant=20, leave=0.25)
    now = _run_batch(a, 0.0)
    running: list[tuple[float, Ticket]] = []
    while now < 8.0:
        running.append((now + 1.0, ticket(a.offer(now, "interactive", "i"))))
        now += 0.125
        for end, t in [x for x in running if x[0] <= now]:
            a.release(end, t)
            running.remove((end, t))
    for _, t in running[1:]:
        a.release(now, t)
    return a, now, running[0][1]


def test_a_batch_ticket_the_reserve_blocks_is_shed_at_offer_with_a_retry_after() -> None:
    """The batch lane was granted requests a few seconds ago (its measured drain rate says a
    queued ticket starts in seconds), but interactive is now measured to need every slot:
    a new batch ticket cannot start within its wait, and is told so at once."""
    a, now, held = _interactive_wanting_every_slot()
    assert a.drain_rate(now, "batch") is not None  # the lagging measurement says it drains
    shed = a.offer(now, "batch", "b")
    assert isinstance(shed, Shed) and (shed.status, shed.reason) == (503, "wait_too_long")
    assert len(a.queues["batch"]) == 0 and a.room(now, "batch") == 0
    # told to come back no sooner than interactive's measured need could fade; once it has
    # (interactive stopped asking), it gets in
    a.release(now, held)
    later = now + shed.retry_after
    assert ticket(a.offer(later, "interactive", "i")).state == "admitted"  # the pool is not empty
    assert ticket(a.offer(later, "batch", "b")).state == "admitted"


def test_without_the_reserve_the_same_batch_ticket_queues() -> None:
    """The prediction follows the policy: no ``leave_for_higher``, no room kept for interactive,
    so the batch ticket may start as interactive's running request ends."""
    a = admission(8, queue=20, per_tenant=20, leave=None)
    now = _run_batch(a, 0.0)
    running = [ticket(a.offer(now, "interactive", "i")) for _ in range(8)]
    waiting = ticket(a.offer(now, "batch", "b"))
    assert waiting.state == "queued"
    assert a.sweep(now + 0.1) == []
    assert a.release(now + 0.5, running[0]) == [waiting]


def _batch_filling_the_pool() -> tuple[Admission, float, list[Ticket], Ticket]:
    """4 slots. Interactive's hold time was measured long ago (its offers have left the
    demand window); batch runs on every slot and one more batch ticket waits, due in 0.25 s."""
    a = admission(4, queue=20, per_tenant=20, leave=0.25)
    i = ticket(a.offer(0.0, "interactive", "i"))
    a.release(1.0, i)
    now = _run_batch(a, 15.0)
    running = [ticket(a.offer(now, "batch", "b")) for _ in range(4)]
    assert all(t.state == "admitted" for t in running)
    waiting = ticket(a.offer(now, "batch", "b"))
    assert waiting.state == "queued"
    return a, now, running, waiting


def test_a_batch_ticket_that_can_start_in_time_stays_queued_and_starts() -> None:
    a, now, running, waiting = _batch_filling_the_pool()
    assert a.predicted_wait(now, "batch", "c", 1.0) == pytest.approx(0.5)  # 2nd in line, 4/s
    assert a.sweep(now + 0.1) == []
    assert a.release(now + 0.2, running[0]) == [waiting]


def test_a_queued_batch_ticket_is_shed_when_the_lanes_above_take_its_room() -> None:
    """Queued while it could start in time; then interactive asks for more than the pool: its
    predicted start moves past its budget, and it is answered then, not 50 s later."""
    a, now, running, waiting = _batch_filling_the_pool()
    now += 0.1
    for _ in range(40):  # 4/s over the window, holding 1 s: 4 slots, 5 with headroom
        a.offer(now, "interactive", "i")
    assert a.room(now, "batch") == 0
    ((t, shed),) = a.sweep(now)
    assert t is waiting and t.state == "dropped" and len(a.queues["batch"]) == 0
    assert (shed.status, shed.reason) == (503, "fell_behind") and shed.retry_after > 0
    assert t.start_by - now > 40.0  # its own wait budget was far from spent
    assert a.release(now, running[0]) and all(x.lane == "interactive" for x in a.pump(now))


def test_a_sweep_answers_504_where_the_clients_deadline_is_what_runs_out() -> None:
    a, now, _, _ = _batch_filling_the_pool()
    late = ticket(a.offer(now, "batch", "c", deadline=now + 0.6))
    assert late.state == "queued"  # second in line at 4/s: due in 0.5 s, 0.6 s left
    patient = ticket(a.offer(now, "batch", "b"))  # behind the first, in its tenant's line
    assert a.sweep(now + 0.05) == []
    # nothing ended by 0.2 s: still 0.5 s away, 0.4 s left
    swept = dict(a.sweep(now + 0.2))
    assert set(swept) == {late} and (swept[late].status, swept[late].reason) == (504, "deadline")
    assert patient.state == "queued"


def test_the_forecast_reads_the_lanes_room_not_only_its_grant_rate() -> None:
    from filters.plugins.admission.forecast import Outlook, fade

    blocked = Outlook(room=0, running=3, hold=2.0, pool_rate=4.0, queued_above=0)
    assert blocked.wait(0) == math.inf and blocked.rate == 0
    # over its room: two of its own must end, unreplaced, before the first start
    over = Outlook(room=2, running=4, hold=2.0, pool_rate=4.0, queued_above=0)
    assert over.wait(0) == pytest.approx(2 * 2.0 / 4 + 1 * 2.0 / 2)
    # under its room: the pool's next freed slots, then one per own request ending
    under = Outlook(room=4, running=2, hold=2.0, pool_rate=4.0, queued_above=4)
    assert under.wait(0) == pytest.approx(4 / 4.0 + 1 / 4.0)
    assert under.wait(3) == pytest.approx(4 / 4.0 + 2 / 4.0 + 2 * 2.0 / 4)
    assert fade(10.0, want_above=10.0, free=7) == pytest.approx(3.0)
    assert fade(10.0, want_above=5.0, free=7) == 0.0


def test_the_forecast_sees_an_interactive_spike_before_the_reserve_has_measured_it() -> None:
    """Interactive asked 1/s for 10 s, then 20 times in one second. The reserve (10 s window)
    has only begun to rise, but it will take every slot within seconds: a batch ticket that
    would wait behind six running batch requests is shed now rather than queued to be shed."""
    a = Admission(
        [LaneConfig("interactive", 0, 0, 5.0), LaneConfig("batch", 20, 20, 50.0, 1.0, 0.25)],
        max_requests=8,
    )
    now = _run_batch(a, 0.0)
    for k in range(10):
        i = ticket(a.offer(now + k, "interactive", "i"))
        a.release(now + k + 1.0, i)
    now += 10.0
    assert all(ticket(a.offer(now, "batch", "b")).state == "admitted" for _ in range(6))
    for k in range(20):
        a.offer(now + 0.05 * k, "interactive", "i")  # two start, the rest find no queue
    now += 1.0
    assert a.reserved_above(now, "batch") <= 2  # the 10 s window: 3/s so far
    shed = a.offer(now, "batch", "b")
    assert isinstance(shed, Shed) and shed.reason == "wait_too_long"


def test_a_blocked_lane_is_told_no_sooner_than_it_lately_started_requests() -> None:
    """The pool completes requests fast, but batch got few of them: a batch client shed while
    the lanes above leave it no room is told the time its lane's own starts take, not the
    pool's (it would come back to the same block)."""
    a, now, _ = _interactive_wanting_every_slot()
    rate = a.drain_rate(now, "batch")
    assert rate is not None and a.room(now, "batch") == 0
    shed = a.offer(now, "batch", "b")
    assert isinstance(shed, Shed)
    assert shed.retry_after >= 1 / rate
    second = a.offer(now, "batch", "c")
    assert isinstance(second, Shed) and second.retry_after >= 2 / rate


def test_a_client_back_when_told_waits_out_its_wait_in_a_blocked_lane() -> None:
    """A fresh batch request is shed at once while interactive needs every slot; one that was
    told to come back now queues for the place it was promised, is not swept as fallen behind,
    and starts when a slot frees within its wait (else it times out, told again)."""
    a, now, held = _interactive_wanting_every_slot()
    fresh = a.offer(now, "batch", "b")
    assert isinstance(fresh, Shed) and fresh.reason == "wait_too_long"
    a.told["batch"].add(now, 1.0, "k", "c")  # told earlier to come back now
    back = ticket(a.offer(now, "batch", "c", key="k"))
    assert back.state == "queued" and back.returning
    assert a.sweep(now + 0.1) == []
    a.release(now + 0.2, held)  # the slot interactive held frees: the promised client starts
    assert back.state == "admitted"
    # one that is never let in gets the last resort, told a time again
    a.told["batch"].add(now + 1.0, 1.0, "k2", "d")
    other = ticket(a.offer(now + 1.0, "batch", "d", key="k2"))
    shed, _ = a.drop(other.start_by, other)
    assert shed is not None and shed.reason == "timed_out"
