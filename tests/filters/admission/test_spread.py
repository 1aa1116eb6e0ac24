"""Lane balance of a ranked pool: the pure choice, the per-process counts across reloads, and
the admission plugin naming the replica (no network)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from filters.api import Context, RouteInfo
from filters.plugins.admission.gate import Gates
from filters.plugins.admission.plugin import AdmissionPlugin
from filters.plugins.admission.spread import LaneBalance, choose
from policy import Policy, load_policy_text
from policy.routing import ENDPOINT_HEADER
from policy.scheduling import PriorityScheduling
from tests.filters.conftest import FakeClock, make_services

RANKED = PriorityScheduling(enabled=True)  # threshold 10, larger values first
INT, BATCH = 100, 0


def test_interactive_goes_where_it_can_preempt_batch_not_behind_interactive() -> None:
    loads = {"a:1": {INT: 3}, "b:1": {BATCH: 6}}
    assert choose(loads, INT, RANKED.preempts, key=None, tie=b"x") == "b:1"
    # batch sees every request in flight as ahead of it
    assert choose(loads, BATCH, RANKED.preempts, key=None, tie=b"x") == "a:1"


def test_equal_blocking_load_goes_to_the_less_loaded_replica_then_rotates() -> None:
    loads = {"a:1": {INT: 1, BATCH: 2}, "b:1": {INT: 1}}
    assert choose(loads, INT, RANKED.preempts, key=None, tie=b"x") == "b:1"
    even: dict[str, dict[int, int]] = {"a:1": {}, "b:1": {}, "c:1": {}}
    picked = {choose(even, INT, RANKED.preempts, key=None, tie=bytes([i])) for i in range(64)}
    assert picked == set(even)  # ties spread by the per-request key, not to the first replica


def test_a_priority_inside_the_threshold_blocks() -> None:
    close = PriorityScheduling(enabled=True, preemption_threshold=200)  # 100 cannot preempt 0
    loads = {"a:1": {INT: 2}, "b:1": {BATCH: 3}}
    assert choose(loads, INT, close.preempts, key=None, tie=b"x") == "a:1"
    low_first = PriorityScheduling(enabled=True, low_values_first=True)
    assert low_first.preempts(-100, 0) and not low_first.preempts(0, -100)
    mixed = {"a:1": {-100: 2}, "b:1": {0: 3}}
    assert choose(mixed, -100, low_first.preempts, key=None, tie=b"") == "b:1"


def test_a_session_sticks_to_its_replica_while_it_is_within_the_bound() -> None:
    names = [f"10.0.0.{i}:8000" for i in range(4)]
    empty: dict[str, dict[int, int]] = {n: {} for n in names}
    home = choose(empty, INT, RANKED.preempts, key=b"conv-7", tie=b"1")
    assert home is not None
    for tie in (b"2", b"3"):  # the tie key does not move a session
        assert choose(empty, INT, RANKED.preempts, key=b"conv-7", tie=tie) == home
    busy = {n: {INT: 1} for n in names}
    assert choose(busy, INT, RANKED.preempts, key=b"conv-7", tie=b"") == home  # balanced
    # its home has batch only: still home (interactive preempts it)
    batch_home = {**empty, home: {BATCH: 9}}
    assert choose(batch_home, INT, RANKED.preempts, key=b"conv-7", tie=b"") == home
    # its home holds far more interactive than the rest: the session spills past it
    hot = {**empty, home: {INT: 5}}
    moved = choose(hot, INT, RANKED.preempts, key=b"conv-7", tie=b"", factor=1.25)
    assert moved is not None and moved != home


def test_no_candidate_no_name() -> None:
    assert choose({}, INT, RANKED.preempts, key=None, tie=b"") is None


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([f"h{i}:1" for i in range(5)]),
        st.dictionaries(st.sampled_from([0, 5, 50, 100]), st.integers(1, 20), max_size=4),
        min_size=1,
    ),
    st.sampled_from([0, 5, 50, 100]),
    st.binary(max_size=8),
)
def test_without_a_session_the_least_blocked_replica_wins(
    loads: dict[str, dict[int, int]], priority: int, tie: bytes
) -> None:
    chosen = choose(loads, priority, RANKED.preempts, key=None, tie=tie)
    assert chosen in loads

    def blocking(name: str) -> int:
        return sum(n for p, n in loads[name].items() if not RANKED.preempts(priority, p))

    assert blocking(chosen) == min(blocking(n) for n in loads)


POLICY = """
version: 1
admission:
  interactive: {{ttft_budget: 60s}}
  batch: {{ttft_budget: 60s, leave_for_higher: null}}
pools:
  chat:
    models: [m1]
    endpoints: [{endpoints}]
    capacity: {{max_running_requests: 4}}
    priority_scheduling: {scheduling}
  plain:
    models: [m2]
    endpoints: [127.0.0.1:9101]
tiers:
  pro: {{lane: interactive}}
  free: {{lane: batch, allowed_lanes: [batch]}}
"""


def policy(
    endpoints: str = "127.0.0.1:9001, 127.0.0.1:9002", scheduling: str = "{enabled: true}"
) -> Policy:
    return load_policy_text(POLICY.format(endpoints=endpoints, scheduling=scheduling))


def test_only_ranked_ring_hash_pools_are_balanced_and_counts_survive_a_reload() -> None:
    lb = LaneBalance()
    lb.configure(policy())
    assert set(lb.pools) == {"chat"}
    first = lb.pick("chat", INT, {})
    assert first is not None
    assert lb.pick("plain", INT, {}) is None
    lb.configure(policy("127.0.0.1:9001, 127.0.0.1:9002, 127.0.0.1:9003"))
    assert lb.pools["chat"].inflight[first] == {INT: 1}
    # the new replica and the other old one are empty: the next two land on them
    assert {lb.pick("chat", INT, {}), lb.pick("chat", INT, {})} == {
        "127.0.0.1:9001",
        "127.0.0.1:9002",
        "127.0.0.1:9003",
    } - {first}
    lb.done("chat", first, INT)
    assert lb.pools["chat"].inflight[first] == {}
    lb.configure(policy(scheduling="{enabled: true, balance: ring}"))
    assert lb.pools == {}


def test_a_pool_not_trusted_to_rank_counts_every_request_as_blocking() -> None:
    lb = LaneBalance()
    lb.configure(policy())
    a, b = "127.0.0.1:9001", "127.0.0.1:9002"
    lb.pools["chat"].inflight = {a: Counter({INT: 1}), b: Counter({BATCH: 3})}
    assert lb.pick("chat", INT, {}) == b  # batch there is preemptable
    lb.done("chat", b, INT)
    assert lb.pick("chat", INT, {}, ranked=False) == a  # it is not: a has less in flight


def test_replicas_the_pool_state_marks_down_are_skipped() -> None:
    lb = LaneBalance()
    lb.configure(policy())
    lb.down = lambda pool: ["127.0.0.1:9001"]
    assert {lb.pick("chat", INT, {}) for _ in range(4)} == {"127.0.0.1:9002"}
    lb.down = lambda pool: ["127.0.0.1:9001", "127.0.0.1:9002"]
    assert lb.pick("chat", INT, {}) is None  # none up: Envoy's ring hash decides


async def test_the_admission_plugin_names_the_replica_and_counts_it_out_at_the_end() -> None:
    clock = FakeClock()
    pol = policy()
    gates = Gates(clock=clock, wall=clock)
    gates.configure(pol)
    registry = CollectorRegistry()
    balance = LaneBalance(registry)
    balance.configure(pol)
    services = replace(make_services(pol, clock), gates=gates, balance=balance)
    plugin = AdmissionPlugin({}, services)

    def ctx(lane: str, pool: str = "chat") -> Context:
        c = Context(route=RouteInfo(name="llm", pool=pool), started=clock())
        c.tenant, c.lane, c.tier = "t", lane, "pro" if lane == "interactive" else "free"
        return c

    placed = []
    for lane in ("batch", "batch", "interactive"):
        c = ctx(lane)
        r = await plugin.request_headers(c, {}, False)
        assert r is not None
        placed.append((c, r.set_headers[ENDPOINT_HEADER]))
    assert placed[0][1] != placed[1][1]  # batch spreads by total load
    counts = {n: dict(c) for n, c in balance.pools["chat"].inflight.items()}
    assert sorted(counts.values(), key=len) == [{0: 1}, {0: 1, 100: 1}]

    def gauge(replica: str, lane: str) -> float | None:
        labels = {"pool": "chat", "replica": replica, "lane": lane}
        return registry.get_sample_value("tokenweir_admission_replica_in_flight", labels)

    mixed = next(n for n, c in counts.items() if len(c) == 2)
    assert gauge(mixed, "interactive") == 1 and gauge(mixed, "batch") == 1
    for c, _ in placed:
        await plugin.stream_end(c)
    assert all(not c for c in balance.pools["chat"].inflight.values())
    assert gauge(mixed, "interactive") == 0 and gauge(mixed, "batch") == 0
    other = ctx("interactive", "plain")
    r = await plugin.request_headers(other, {}, False)
    assert r is None or ENDPOINT_HEADER not in r.set_headers
