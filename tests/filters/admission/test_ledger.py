"""Tenants share a lane in tokens (virtual token counters): a saturated lane, simulated on the
pure admission core, serves two backlogged tenants their weights' shares of the settled tokens,
whatever their requests' sizes; the fairness gauges' window; counters that never settle."""

from __future__ import annotations

import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filters.plugins.admission.core import Admission, LaneConfig
from filters.plugins.admission.ledger import DEFAULT_COST, SETTLE_WAIT, TokenLedger
from filters.plugins.admission.queues import Ticket


def _saturated_run(
    sizes: dict[str, int], weights: dict[str, float], *, slots: int = 4, seconds: float = 600.0,
    tokens_per_s: float = 100.0, settle: str = "at_release",
) -> dict[str, float]:  # fmt: skip
    """Every tenant keeps its queue full; each request runs size / tokens_per_s seconds and is
    served its size. ``settle``: ``at_release`` (the Python meter: usage known at the end),
    ``later`` (Envoy's meter: the access log brings it a second later), ``charge`` (no usage
    metered: the admission plugin settles what the request was expected to cost)."""
    lane = LaneConfig("batch", max_wait=1e9, max_queue=1000, max_queue_per_tenant=500)
    a = Admission([lane], max_requests=slots)
    events: list[tuple[float, int, str, Ticket]] = []  # (when, seq, what, ticket)
    served = dict.fromkeys(sizes, 0.0)
    seq = 0

    def push(when: float, what: str, t: Ticket) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (when, seq, what, t))

    def offer(now: float, tenant: str) -> None:
        t = a.offer(now, "batch", tenant, weight=weights[tenant])
        assert isinstance(t, Ticket)
        if t.state == "admitted":
            push(now + sizes[t.tenant] / tokens_per_s, "end", t)

    for tenant in sizes:
        for _ in range(8):
            offer(0.0, tenant)
    while events:
        now, _, what, t = heapq.heappop(events)
        if now > seconds:
            break
        size = sizes[t.tenant]
        if what == "usage":
            a.settle(now, "batch", t.tenant, size)
            continue
        served[t.tenant] += size
        settled = {"at_release": size, "later": None, "charge": t.charge}[settle]
        for started in a.release(now, t, settled):
            push(now + sizes[started.tenant] / tokens_per_s, "end", started)
        if settle == "later":
            push(now + 1.0, "usage", t)
        offer(now, t.tenant)  # it stays backlogged
    return served


@settings(max_examples=25, deadline=None)
@given(
    size_a=st.integers(20, 2000),
    size_b=st.integers(20, 2000),
    wa=st.sampled_from([1.0, 2.0, 3.0]),
    wb=st.sampled_from([1.0, 2.0, 3.0]),
)
def test_backlogged_tenants_share_the_settled_tokens_by_weight(
    size_a: int, size_b: int, wa: float, wb: float
) -> None:
    served = _saturated_run({"a": size_a, "b": size_b}, {"a": wa, "b": wb})
    ratio = (served["a"] / wa) / (served["b"] / wb)
    assert ratio == pytest.approx(1.0, rel=0.1), served


def test_one_to_three_by_weight_though_the_light_tenant_asks_ten_times_more() -> None:
    """Request fairness would give tenant a (answers of 1,000 tokens) ten times b's tokens."""
    served = _saturated_run({"a": 1000, "b": 100}, {"a": 1.0, "b": 3.0})
    assert served["b"] / served["a"] == pytest.approx(3.0, rel=0.1)


def test_usage_from_envoys_access_log_a_second_later_shares_as_well() -> None:
    served = _saturated_run({"a": 1000, "b": 100}, {"a": 1.0, "b": 3.0}, settle="later")
    assert served["b"] / served["a"] == pytest.approx(3.0, rel=0.1)


def test_with_no_usage_metered_each_request_counts_its_expected_cost() -> None:
    """Request-count fairness then (nothing tells the sizes apart)."""
    served = _saturated_run({"a": 1000, "b": 100}, {"a": 1.0, "b": 1.0}, settle="charge")
    requests = {t: served[t] / s for t, s in (("a", 1000), ("b", 100))}
    assert requests["a"] == pytest.approx(requests["b"], rel=0.1)


def test_an_ended_request_keeps_its_charge_until_its_usage_has_had_time_to_arrive() -> None:
    ledger = TokenLedger()
    charge = ledger.start("t", 1.0)
    assert charge == DEFAULT_COST and ledger.vtime("t") == DEFAULT_COST
    ledger.end("t", charge, now=10.0)  # the access log has not brought its usage yet
    assert ledger.vtime("t") == DEFAULT_COST
    ledger.settle("t", 40, now=10.5)  # it arrives; the stand-in stays its full wait
    assert ledger.vtime("t") == DEFAULT_COST + 40
    ledger.expire(10.0 + SETTLE_WAIT)
    assert ledger.vtime("t") == 40
    assert ledger.expected("t") == 40  # its usage taught the tenant's cost per request
    assert ledger.expected("new") == 40  # a new tenant starts from the lane's
    c2 = ledger.start("t", 2.0)
    assert c2 == 40 and ledger.vtime("t") == 40  # (40 settled + 40 running) / 2
    ledger.end("t", c2, now=20.0, tokens=60)  # the Python meter: usage known at the end
    assert ledger.settled("t") == 100 and ledger.vtime("t") == 50


def test_an_idle_tenant_joins_behind_the_last_one_served_and_banks_no_credit() -> None:
    ledger = TokenLedger()
    ledger.settle("busy", 5000, now=0.0)
    ledger.join("idle", 1.0, floor=4000.0)
    assert ledger.vtime("idle") == 4000.0
    ledger.join("idle", 1.0, floor=100.0)  # a lift never lowers a counter
    assert ledger.vtime("idle") == 4000.0


def test_the_fairness_window_counts_only_backlogged_tenants() -> None:
    ledger = TokenLedger()
    assert ledger.snapshot(0.0, 60.0, ["a", "b"]) is None  # nothing older to compare
    for i in range(1, 7):
        ledger.settle("a", 300, now=10.0 * i)
        ledger.settle("b", 100, now=10.0 * i)
        ledger.settle("c", 900, now=10.0 * i)  # never waited: its share is not in question
        fair = ledger.snapshot(10.0 * i, 60.0, ["a", "b"])
    assert fair is not None and fair.tenants == 2
    assert fair.jain == pytest.approx((400 * 6) ** 2 / (2 * ((300 * 6) ** 2 + (100 * 6) ** 2)))
    assert fair.gap == 200 * 6
