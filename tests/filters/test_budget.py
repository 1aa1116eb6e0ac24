from __future__ import annotations

import asyncio
import logging

import pytest

from filters.budget import CachedBudget
from quota.errors import QuotaUnavailable
from tests.filters.conftest import FakeBudget, FakeClock


async def test_cached_budget_reuses_reads_and_debits_local_reservations() -> None:
    reader, clock = FakeBudget({"t": 1000}), FakeClock()
    budget = CachedBudget(reader, clock=clock, ttl=0.25)
    assert await budget.remaining("t", "m", "batch") == 1000
    budget.note_reserved("t", "m", "batch", 300)
    assert await budget.remaining("t", "m", "batch") == 700  # cached, minus our reservation
    budget.note_reserved("t", "m", "batch", 900)
    assert await budget.remaining("t", "m", "batch") == 0  # never negative
    assert len(reader.calls) == 1
    clock.now += 0.3
    reader.left["t"] = 400
    assert await budget.remaining("t", "m", "batch") == 400  # re-read after the TTL
    assert await budget.remaining("t", "m", "interactive") == 400  # another key reads
    assert len(reader.calls) == 3
    reader.left["u"] = None
    assert await budget.remaining("u") is None


async def test_cached_answers_a_fresh_value_without_io_and_misses_otherwise() -> None:
    reader, clock = FakeBudget({"t": 1000, "u": None}), FakeClock()
    budget = CachedBudget(reader, clock=clock, ttl=0.25)
    assert budget.cached("t", "m", "batch") == (False, None)  # never read
    assert await budget.remaining("t", "m", "batch") == 1000
    budget.note_reserved("t", "m", "batch", 300)
    assert budget.cached("t", "m", "batch") == (True, 700)  # the read, less our reservation
    assert budget.cached("t", "m", "interactive") == (False, None)  # another key
    await budget.remaining("u")
    assert budget.cached("u", None, None) == (True, None)  # unlimited is known too
    clock.now += 0.3
    assert budget.cached("t", "m", "batch") == (False, None)  # past the TTL: read again
    assert len(reader.calls) == 2


async def test_ttl_zero_reads_every_time() -> None:
    reader = FakeBudget({"t": 5})
    budget = CachedBudget(reader, clock=FakeClock(), ttl=0)
    for _ in range(3):
        assert await budget.remaining("t") == 5
    assert len(reader.calls) == 3


class GatedReader(FakeBudget):
    """Reads wait for ``gate``; ``fail`` makes them raise."""

    def __init__(self, left: dict[str, int | None]) -> None:
        super().__init__(left)
        self.gate = asyncio.Event()
        self.fail: BaseException | None = None

    async def remaining(
        self, tenant: str, model: str | None = None, lane: str | None = None
    ) -> int | None:
        self.calls.append((tenant, model, lane))
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return self.left.get(tenant)


async def test_300_concurrent_misses_of_one_tenant_are_one_read() -> None:
    reader = GatedReader({"t": 1000})
    budget = CachedBudget(reader, clock=FakeClock(), ttl=0.25)
    waiting = [asyncio.ensure_future(budget.remaining("t", "m", "batch")) for _ in range(300)]
    await asyncio.sleep(0)
    waiting[0].cancel()  # a caller that gives up does not cancel the read for the others
    reader.gate.set()
    results = await asyncio.gather(*waiting[1:])
    assert results == [1000] * 299 and len(reader.calls) == 1
    await budget.aclose()


async def test_a_failed_read_answers_the_last_value_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reader, clock, errors = GatedReader({"t": 1000}), FakeClock(), []
    reader.gate.set()
    budget = CachedBudget(reader, clock=clock, ttl=0.25, on_error=lambda: errors.append(1))
    assert await budget.remaining("t") == 1000
    budget.note_reserved("t", None, None, 100)
    reader.fail = QuotaUnavailable("redis: ConnectionError")
    with caplog.at_level(logging.WARNING, logger="filters.budget"):
        for _ in range(20):
            clock.now += 0.3
            assert await budget.remaining("t") == 900
        assert await budget.remaining("other") is None
    assert len(errors) == 21
    assert len(caplog.records) == 1 and "ConnectionError" in caplog.records[0].getMessage()
