"""A Retry-After is a promise: a client that comes back when told goes before the fresh
arrivals of its lane, and fresh arrivals count the clients due back before they could start
(the pure core, the lane queue and the plugin; issue 10's Retry-After accuracy)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json

import pytest

from filters.plugins.admission.core import Admission, Shed
from filters.plugins.admission.gate import Gates
from filters.plugins.admission.plugin import return_key
from filters.plugins.admission.queues import LaneQueue, Ticket
from tests.filters.admission.test_core import admission, ticket
from tests.filters.admission.test_plugin import Setup, settle


def test_a_returning_client_is_served_before_fresh_tickets_and_charged_to_its_tenant() -> None:
    q = LaneQueue("interactive", bound=2, tenant_bound=2)
    fresh = [Ticket(i, "interactive", t, 1.0, 0, 0.0, 9.0) for i, t in enumerate("xy")]
    for t in fresh:
        q.push(t)
    back = Ticket(5, "interactive", "x", 1.0, 0, 1.0, 9.0, key="k", returning=True)
    assert q.refusal("z") == "queue_full" and q.refusal("x", returning=True) is None
    assert q.refusal("x") == "queue_full"
    q.push(back)
    assert len(q) == 3 and q.returning == 1 and q.peek() is back
    # every fresh ticket has the returning one before it, besides its fair-queue estimate
    assert q.ranked()[0] == (back, 0) and [n for _, n in q.ranked()[1:]] == [2, 2]
    assert q.ahead_of_new("z", 1.0) == 3 and q.queued("x") == 2
    assert q.tenants() == {"x": 2, "y": 1} and q.refusal("x", returning=True) == (
        "tenant_queue_full"
    )
    assert q.pop() is back
    q.ledger.start("x", 1.0)  # its start (admission's grant) is charged to its tenant's counter
    assert q.pop() is fresh[1]  # x's start was charged: y goes before x's fresh one
    assert q.remove(fresh[0]) and len(q) == 0


def one_slot(rate: float = 10.0, *, wait: float = 5.0, queue: int = 2) -> tuple[Admission, Ticket]:
    """One slot, ``rate`` completions/s measured for a second; the ticket left running."""
    a = admission(1, queue=queue, per_tenant=queue, wait=wait)
    running = ticket(a.offer(0.0, "interactive", "a"))
    for i in range(int(rate)):
        now = (i + 1) / rate
        a.release(now, running)
        running = ticket(a.offer(now, "interactive", "a"))
    return a, running


def test_a_client_back_when_told_starts_before_those_that_came_meanwhile() -> None:
    a, running = one_slot()
    for who in "bc":
        assert ticket(a.offer(1.0, "interactive", who)).state == "queued"
    shed = a.offer(1.0, "interactive", "d", key="d")
    assert isinstance(shed, Shed) and shed.reason == "queue_full"
    back_at = 1.0 + shed.retry_after
    (running,) = a.release(1.05, running)  # b
    (running,) = a.release(1.10, running)  # c
    fresh = ticket(a.offer(back_at - 0.01, "interactive", "e", key="e"))
    assert fresh.state == "queued"
    back = ticket(a.offer(back_at, "interactive", "d", key="d"))
    assert back.state == "queued" and back.returning
    assert a.queues["interactive"].peek() is back
    (first,) = a.release(back_at + 0.01, running)
    assert first is back and a.told["interactive"].claimed == 1
    # a client of another key at the same time is fresh: it queues behind
    assert not ticket(a.offer(back_at + 0.02, "interactive", "f", key="d2")).returning


def test_a_full_lane_still_takes_a_client_it_promised_a_place() -> None:
    a, _ = one_slot()
    for who in "bc":
        a.offer(1.0, "interactive", who)
    shed = a.offer(1.0, "interactive", "d", key="d")
    assert isinstance(shed, Shed)
    # nothing started meanwhile: the lane is still full when d is back
    back = a.offer(1.0 + shed.retry_after, "interactive", "d", key="d")
    assert isinstance(back, Ticket) and back.returning and len(a.queues["interactive"]) == 3
    # a fresh client is still turned away by the bound
    again = a.offer(1.0 + shed.retry_after, "interactive", "z", key="z")
    assert isinstance(again, Shed) and again.reason == "queue_full"


def test_a_fresh_client_counts_the_clients_due_back_before_it_could_start() -> None:
    a, _ = one_slot(wait=0.5, queue=64)  # starts one request per 0.1 s; waits at most 0.5 s
    alone = a.predicted_wait(1.0, "interactive", "z", 1.0)
    assert alone == pytest.approx(0.1)
    for k in range(5):  # told 0.1, 0.2, ... 0.5 s: due back before z could start
        a.retry_after(1.0, "interactive", key=f"told-{k}")
    assert a.predicted_wait(1.0, "interactive", "z", 1.0) == pytest.approx(0.6)
    shed = a.offer(1.0, "interactive", "z", key="z")
    assert isinstance(shed, Shed) and shed.reason == "wait_too_long"
    # a client that is one of them is not held back by the others
    back = a.offer(1.0 + 0.1, "interactive", "told-0", key="told-0")
    assert isinstance(back, Ticket) and back.returning


def test_clients_that_never_come_back_stop_holding_fresh_ones_back() -> None:
    a, _ = one_slot(wait=0.5, queue=64)
    for k in range(40):  # told, and never back: their windows pass
        a.retry_after(1.0, "interactive", key=f"gone-{k}")
    a.told["interactive"].outstanding(100.0)
    assert a.told["interactive"].expired == 40 and a.told["interactive"].return_share < 0.5
    for k in range(5):
        a.retry_after(100.0, "interactive", key=f"told-{k}")
    wait = a.predicted_wait(100.0, "interactive", "z", 1.0)
    assert wait is not None and wait < 0.5


def test_return_keys_tell_tenants_and_requests_apart() -> None:
    h = {"content-length": "812"}
    assert return_key("a", h) == return_key("a", dict(h))
    assert return_key("a", h) != return_key("b", h)
    assert return_key("a", h) != return_key("a", {"content-length": "813"})
    keyed = {**h, "idempotency-key": "k1"}
    assert return_key("a", keyed) != return_key("a", {**h, "idempotency-key": "k2"})


async def test_a_shed_client_that_comes_back_as_told_is_counted_and_goes_first() -> None:
    s = Setup(cap=1)  # 2 slots; interactive queue 2
    gates: Gates = s.gates
    running = [s.ctx("a"), s.ctx("a")]
    for c in running:
        assert await s.headers(c, **{"content-length": "10"}) is None
    waiting = [s.ctx(t) for t in "bc"]
    tasks = [asyncio.create_task(s.headers(c, **{"content-length": "11"})) for c in waiting]
    await settle()
    r = await s.headers(s.ctx("d"), **{"content-length": "812"})
    assert r is not None and r.reply is not None and r.reply.status == 503
    assert json.loads(r.reply.body)["error"]["code"] == "queue_full"
    told = int(r.reply.headers["retry-after-ms"]) / 1000
    for c in running:  # b and c start
        await s.plugin.stream_end(c)
    for t in tasks:
        assert await t is None
    s.clock.now += told
    back = asyncio.create_task(s.headers(s.ctx("d"), **{"content-length": "812"}))
    fresh = asyncio.create_task(s.headers(s.ctx("e"), **{"content-length": "812"}))
    await settle()
    gate = gates.gate("chat")
    assert gate is not None and gate.core.queues["interactive"].returning == 1
    await s.plugin.stream_end(waiting[0])
    await settle()
    assert back.done() and not fresh.done()
    assert await back is None
    m = gates.metrics.returns.labels("chat", "interactive", "claimed")
    assert m._value.get() == 1
    fresh.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await fresh


def test_a_tenant_holds_no_more_promised_places_than_it_may_queue() -> None:
    """One tenant shed again and again cannot line up ahead of everyone: past its per-tenant
    queue bound its clients are told a time, and come back fresh."""
    a, _ = one_slot(queue=2)  # per-tenant bound 2 as well
    for who in "bc":
        a.offer(1.0, "interactive", who)
    sheds = [a.offer(1.0, "interactive", "greedy", key=f"g{k}") for k in range(5)]
    assert all(isinstance(s, Shed) for s in sheds)
    told = a.told["interactive"]
    assert told.held("greedy") == 2 and told.outstanding(1.0) == 5
    other = a.offer(1.0, "interactive", "modest", key="m")
    assert isinstance(other, Shed) and told.held("modest") == 1
    late = 1.0 + max(s.retry_after for s in sheds if isinstance(s, Shed))
    assert told.claim(late, "g0") and told.claim(late, "g1")
    assert not told.claim(late, "g2")  # told a time, never a place


def test_a_burst_shed_before_anything_is_measured_is_told_spread_times() -> None:
    """Nothing measured yet (no grant rate, no completion): the clients are told the lane's
    longest wait, as many as it holds at once, and the later ones times spread evenly up to
    twice it, however many they are (not one herd)."""
    a = admission(cap=4, wait=1.0)  # interactive: 1 s longest wait, 4 slots
    told = [a.retry_after(0.0, "interactive", key=("t", str(i), ""), tenant=f"t{i}")
            for i in range(40)]  # fmt: skip
    assert told[:4] == [1.0] * 4
    rest = told[4:]
    assert len(set(rest)) == len(rest) and all(1.0 < t < 2.0 for t in rest)
    for k in (8, 20, 36):  # every prefix covers [1, 2) evenly: no tenth holds a crowd
        tenths = [sum(1 for t in rest[:k] if 1.0 + i / 10 <= t < 1.1 + i / 10) for i in range(10)]
        assert max(tenths) <= k / 10 + 2, (k, tenths)
    # and a keyed client there is recognised when it comes back in its window
    assert a.told["interactive"].claimable(told[5], ("t", "5", ""))


def test_a_bursts_first_grants_are_not_a_drain_rate() -> None:
    """A burst fills the free slots at once: 4 grants within 30 ms (133/s "measured") and no
    request has ended. The clients shed then are told as when nothing is measured (the lane's
    longest wait, then spread up to twice it), not paced at 133/s: that told a third of a
    storm to come back within one quarter second (CI, test_storm_ladder)."""
    a = admission(cap=4, wait=1.0)
    for i in range(4):
        ticket(a.offer(0.01 * i, "interactive", f"x{i}"))
    told = [a.retry_after(0.03, "interactive", key=("t", str(i), ""), tenant=f"t{i}")
            for i in range(8)]  # fmt: skip
    assert told[0] >= 1.0 and all(1.0 <= t < 2.0 for t in told), told
    assert max(told) - min(told) > 0.5, told  # spread, not one instant


def test_before_anything_ended_clients_are_told_as_long_again_as_the_running_requests_ran() -> None:
    """Nothing has ended yet (a cold filter process meets a storm): the clients are told twice
    the running requests' mean age, no sooner than 1 s and no later than the lane's longest
    wait, spread up to twice that. The lane's longest wait alone (10 s here) told a storm on
    30 ms requests to come back 10-24 s later while the pool idled from its third second
    (test_storm_ladder)."""
    a = admission(cap=4, wait=10.0)
    for i in range(4):
        ticket(a.offer(0.01 * i, "interactive", f"x{i}"))
    told = [a.retry_after(0.05, "interactive", key=("t", str(i), ""), tenant=f"t{i}")
            for i in range(8)]  # fmt: skip
    assert all(1.0 <= t < 2.0 for t in told), told  # not 10-20 s
    assert max(told) - min(told) > 0.5, told  # spread, not one instant
    # the requests run on for 3 s, none ends: each new answer is later (a back-off)
    later = a.retry_after(3.0, "interactive", key=("t", "9", ""), tenant="t9")
    assert 2 * (3.0 - 0.015) <= later < 4 * (3.0 - 0.015), later
    # never past the lane's longest wait, doubled by the spread at most
    assert a.retry_after(60.0, "interactive", key=("t", "a", ""), tenant="ta") < 20.0


def test_clients_told_under_a_light_load_are_paced_at_what_the_lane_can_start() -> None:
    """One request a second, each holding its slot 1 s, on 4 slots: the grant rate says 1/s,
    but the lane starts 4/s once full, so a burst shed now is told times 0.25 s apart (at the
    grant rate it would come back over four times as long while the pool idled)."""
    a = admission(cap=4, wait=1.0)
    now = 0.0
    for _ in range(12):
        t = ticket(a.offer(now, "interactive", "x"))
        now += 1.0
        a.release(now, t)
    told = [a.retry_after(now, "interactive", key=("t", str(i), ""), tenant=f"t{i}")
            for i in range(8)]  # fmt: skip
    gaps = [y - x for x, y in itertools.pairwise(told)]
    assert all(abs(g - 0.25) < 0.01 for g in gaps), gaps
