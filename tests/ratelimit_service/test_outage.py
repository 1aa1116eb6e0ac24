"""What the local buckets spent while Redis was down, charged into Redis once it answers
(ratelimit_service/outage.py and Decider.reconcile), on fakes: a MemoryStore stands for Redis."""

from __future__ import annotations

import asyncio

from envoy.service.ratelimit.v3 import rls_pb2

from policy import Policy
from ratelimit_service.outage import OutageLedger
from tests.ratelimit_service import rls
from tests.ratelimit_service.test_decider import make, policy  # noqa: F401  (the fixture)

OK = rls_pb2.RateLimitResponse.OK
KEY = ("acme", "big", "interactive")


def test_a_subject_is_due_once_its_local_reservations_are_settled_or_lost() -> None:
    ledger = OutageLedger(ttl_us=60_000_000)
    ledger.reserved("r1", KEY, [], 500, 50, now_us=0)
    ledger.reserved("r2", KEY, [], 300, 30, now_us=0)
    ledger.settled("r1", 120, 12)  # its real cost replaces its reservation
    assert ledger.due(1) == []  # r2 still open: a charge is never followed by a refund
    ledger.settled("r2", 80, 8)
    ledger.settled("r2", 80, 8)  # settled twice: counted once
    (spent,) = ledger.due(2)
    assert (spent.tokens, spent.usd) == (200, 20) and len(ledger) == 0
    ledger.reserved("r3", KEY, [], 400, 0, now_us=0)
    assert ledger.due(60_000_000) == []
    (lost,) = ledger.due(60_000_001)  # past the TTL: its reservation stands as its cost
    assert lost.tokens == 400
    ledger.put_back(lost)  # Redis failed again: kept for the next try
    ledger.reserved("r4", KEY, [], 10, 0, now_us=70_000_000)
    ledger.settled("r4", 10, 0)
    (again,) = ledger.due(70_000_001)
    assert again.tokens == 410


async def test_the_outage_is_charged_into_redis_when_it_answers(policy: Policy) -> None:  # noqa: F811
    store = _Flaky()
    d, _ = make(policy, store=store)
    assert d.health is not None
    assert (await d.decide(rls.llm("acme", 100, rid="a"))).overall_code == OK  # in "Redis"
    d.health.up = False  # Redis gone: the local buckets decide
    for i in range(3):
        assert (await d.decide(rls.llm("acme", 200, rid=f"o{i}"))).overall_code == OK
        await d.decide(rls.llm("acme", 150, rid=f"o{i}", phase="settle"))  # settled locally
    assert store.remaining("acme") == 900  # Redis knows nothing of the outage yet
    d.health.up = True
    assert (await d.decide(rls.llm("acme", 50, rid="b"))).overall_code == OK
    for _ in range(100):
        if store.remaining("acme") <= 900 - 50 - 450:
            break
        await asyncio.sleep(0.01)
    assert store.remaining("acme") == 900 - 50 - 450  # the three settled at 150 each
    samples = d.metrics.registry.get_sample_value
    assert samples("tokenweir_ratelimit_outage_charged_tokens_total") == 450
    assert samples("tokenweir_ratelimit_outage_charges_total", {"result": "charged"}) == 1
    await d.aclose()


class _Flaky:
    """A MemoryStore standing for Redis (the decider's health says when it is down)."""

    def __init__(self) -> None:
        from ratelimit_service.store import MemoryStore

        self.inner = MemoryStore()

    async def reserve(self, *a, **kw):  # type: ignore[no-untyped-def]
        return await self.inner.reserve(*a, **kw)

    async def settle(self, *a, **kw):  # type: ignore[no-untyped-def]
        return await self.inner.settle(*a, **kw)

    def remaining(self, tenant: str) -> float:
        for key, (tk, _, _) in self.inner.state.buckets.items():
            if tenant in key and key.endswith(":b:tokens"):
                return round(tk)
        raise KeyError(tenant)
