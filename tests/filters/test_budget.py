from __future__ import annotations

from filters.budget import CachedBudget
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


async def test_ttl_zero_reads_every_time() -> None:
    reader = FakeBudget({"t": 5})
    budget = CachedBudget(reader, clock=FakeClock(), ttl=0)
    for _ in range(3):
        assert await budget.remaining("t") == 5
    assert len(reader.calls) == 3
