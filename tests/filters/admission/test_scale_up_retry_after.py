"""Issue 42 part 3: while a pool's replicas start (a scale-up under way, from the pool state),
the Retry-After that admission and the degradation ladder promise is cut to when the first of
them should serve — only where that is sooner, and never when none starts, its time is unknown
or it is overdue. Through the real pool-state JSON and reader, on fake clocks (no network)."""

from __future__ import annotations

import asyncio
import json

from prometheus_client import CollectorRegistry, generate_latest

from filters.api import Result
from filters.plugins.admission.core import Shed
from filters.plugins.admission.gate import Gates
from filters.plugins.admission.signal import ready_source
from poolstate import PoolState, PoolSummary
from poolstate.reader import PoolStateReader
from tests.filters.admission.test_plugin import Setup as AdmissionSetup
from tests.filters.admission.test_plugin import settle
from tests.filters.conftest import FakeClock
from tests.filters.ladder.test_plugin import Setup as LadderSetup

WALL = 1_700_000_000.0


def reader_saying(clock: FakeClock, **pool: object) -> PoolStateReader:
    """A pool-state reader that last heard, as JSON, pool chat with ``pool``'s keys."""
    doc = PoolState(1, WALL, {"chat": PoolSummary()}).to_json()
    doc["pools"]["chat"].update(pool)
    reader = PoolStateReader("http://127.0.0.1:1/api/v1/pools", clock=clock)
    assert reader.accept(json.loads(json.dumps(doc)))
    return reader


def test_the_pool_state_carries_the_replicas_starting_and_when_the_first_serves() -> None:
    summary = PoolSummary(starting=2, ready_at=WALL + 40)
    back = PoolSummary.from_json(json.loads(json.dumps(summary.to_json())))
    assert (back.starting, back.ready_at) == (2, WALL + 40)
    assert back.ready_in(WALL + 10) == 30
    assert back.ready_in(WALL + 40) is None  # overdue: nothing promised
    assert PoolSummary(starting=2).ready_in(WALL) is None  # time unknown
    assert PoolSummary(ready_at=WALL + 40).ready_in(WALL) is None  # none starting
    plain = PoolSummary().to_json()  # none starting: the keys are left out (older readers)
    assert "starting" not in plain and "ready_at" not in plain
    assert PoolSummary.from_json(plain).starting == 0


def test_promise_cuts_the_retry_after_only_where_a_scale_up_is_sooner() -> None:
    clock, wall, registry = FakeClock(), FakeClock(WALL), CollectorRegistry()
    gates = Gates(clock=clock, wall=wall, registry=registry)
    shed = Shed(503, "queue_full", 20.0)
    assert gates.promise("chat", shed) is shed  # no pool state read: unchanged
    gates.ready_in = ready_source(reader_saying(clock, starting=1, ready_at=WALL + 8), wall)
    assert gates.promise("chat", shed).retry_after == 8.0
    assert gates.promise("chat", Shed(503, "queue_full", 5.0)).retry_after == 5.0  # sooner
    assert gates.promise("other", shed) is shed  # a pool the state does not name
    wall.now += 7.5
    assert gates.promise("chat", shed).retry_after == 1.0  # at least a second
    wall.now += 1  # the replica is overdue: no promise it would keep
    assert gates.promise("chat", shed) is shed
    gates.ready_in = ready_source(reader_saying(clock, starting=0), wall)
    assert gates.promise("chat", shed) is shed
    text = generate_latest(registry).decode()
    assert 'tokenweir_admission_retry_after_shortened_total{pool="chat"} 2.0' in text


async def shed_by_admission(s: AdmissionSetup) -> Result:
    for _ in range(2):  # two slots taken, the tenant's one batch place taken
        await s.headers(s.ctx("x", "batch", "free"))
    s.clock.now += 2.0  # they have run 2 s, none ended: told twice that (nothing measured)
    queued = asyncio.create_task(s.headers(s.ctx("x", "batch", "free")))
    await settle()
    r = await s.headers(s.ctx("x", "batch", "free"))
    queued.cancel()
    assert r is not None and r.reply is not None and r.reply.status == 503
    return r


async def test_admission_sheds_promise_the_starting_replica() -> None:
    before = await shed_by_admission(AdmissionSetup(cap=1))
    assert before.reply is not None and int(before.reply.headers["retry-after"]) > 3
    s = AdmissionSetup(cap=1)
    s.gates.ready_in = ready_source(
        reader_saying(s.clock, starting=1, ready_at=s.wall() + 3), s.wall
    )
    after = await shed_by_admission(s)
    assert after.reply is not None
    assert after.reply.headers["retry-after"] == "3"
    assert after.reply.headers["retry-after-ms"] == "3000"
    assert "retry after 3s" in json.loads(after.reply.body)["error"]["message"]


async def test_the_ladders_sheds_promise_the_starting_replica() -> None:
    s = LadderSetup()
    s.level = 1.6  # the shed step: batch turned away before the queue
    out = await s.plugin.request_headers(s.ctx("pro", "batch"), {}, False)
    assert out is not None and out.reply is not None
    assert int(out.reply.headers["retry-after"]) > 2
    s = LadderSetup()
    s.level = 1.6
    s.gates.ready_in = ready_source(
        reader_saying(s.clock, starting=2, ready_at=s.clock() + 2), s.clock
    )
    out = await s.plugin.request_headers(s.ctx("pro", "batch"), {}, False)
    assert out is not None and out.reply is not None
    assert out.reply.headers["retry-after"] == "2"


def test_the_clients_promised_a_starting_replica_are_told_one_second_apart() -> None:
    """Clients shed while one replica loads do not all come back the instant it serves: one
    second apart, over as long again as the wait, never past their own promise."""
    clock, wall = FakeClock(), FakeClock(WALL)
    gates = Gates(clock=clock, wall=wall, registry=CollectorRegistry())
    gates.ready_in = ready_source(reader_saying(clock, starting=1, ready_at=WALL + 8), wall)
    told = [gates.promise("chat", Shed(503, "queue_full", 20.0)).retry_after for _ in range(10)]
    assert told == [8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 8.0, 9.0]
    # a client whose own promise is sooner than that spread keeps its own
    near = [gates.promise("chat", Shed(503, "queue_full", 10.0)).retry_after for _ in range(3)]
    assert near == [8.0, 9.0, 8.0]
    # another replica loading (a later ready_at): the count starts over
    gates.ready_in = ready_source(reader_saying(clock, starting=1, ready_at=WALL + 30), wall)
    assert gates.promise("chat", Shed(503, "queue_full", 60.0)).retry_after == 30.0
    assert gates.promise("other", Shed(503, "queue_full", 60.0)).retry_after == 60.0
