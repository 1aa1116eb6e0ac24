"""The scrape loop on a fake fetcher and a fake clock: versions, staleness, capacity, marks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controlplane.saturation.errors import NameNotFound, ScrapeError
from controlplane.saturation.fetch import HttpFetcher
from controlplane.saturation.scraper import PoolScraper
from controlplane.saturation.targets import PoolTargets, ScrapeSettings, targets_from_policy
from policy import load_policy_text
from poolstate import SATURATED, Capacity, Hysteresis, PoolState


def gauges(running: int, queued: int, used: int = 0) -> str:
    return (
        f'sglang:num_running_reqs{{model_name="m"}} {running}\n'
        f'sglang:num_queue_reqs{{model_name="m"}} {queued}\n'
        f'sglang:num_used_tokens{{model_name="m"}} {used}\n'
        'sglang:max_total_num_tokens{model_name="m"} 1000\n'
    )


class FakeFetcher:
    def __init__(self) -> None:
        self.texts: dict[str, str | None] = {}
        self.unnamed: set[str] = set()  # host names that do not resolve (no ready pod)
        self.infos: dict[str, dict[str, Any]] = {}
        self.info_calls: list[str] = []
        self.closed = False

    async def metrics(self, endpoint: str, timeout_s: float) -> str:
        if endpoint in self.unnamed:
            raise NameNotFound(f"{endpoint}: Name or service not known")
        text = self.texts.get(endpoint)
        if text is None:
            raise ScrapeError(f"{endpoint}: connection refused")
        return text

    async def server_info(self, endpoint: str, timeout_s: float) -> dict[str, Any]:
        self.info_calls.append(endpoint)
        if endpoint not in self.infos:
            raise ScrapeError("404")
        return self.infos[endpoint]

    async def aclose(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


A, B = "127.0.0.1:1", "127.0.0.1:2"


CAP = Capacity(max_running_requests=10, max_queued_requests=10)


def make(cap: Capacity = CAP) -> tuple[PoolScraper, FakeFetcher, Clock]:
    fetcher, clock = FakeFetcher(), Clock()
    s = PoolScraper(fetcher, clock=clock, wall_clock=clock, registry=CollectorRegistry())
    s.configure(
        ScrapeSettings(interval_s=0.25, timeout_s=0.2, stale_after_s=1.0),
        {"chat": PoolTargets((A, B), cap, Hysteresis(1.0, 0.8))},
    )
    return s, fetcher, clock


async def test_a_round_publishes_each_replica_and_the_pool() -> None:
    s, f, _ = make()
    f.texts = {A: gauges(5, 0), B: gauges(10, 5)}
    state = await s.scrape_once()
    chat = state.pools["chat"]
    assert state.version == 1
    assert chat.endpoints[A].saturation == 0.5 and not chat.endpoints[A].degraded
    assert chat.endpoints[B].saturation == 1.5 and chat.endpoints[B].degraded
    assert (chat.running, chat.queued, chat.capacity_running) == (15, 5, 20)


async def test_the_version_grows_only_when_something_changed() -> None:
    s, f, clock = make()
    f.texts = {A: gauges(1, 0), B: gauges(1, 0)}
    assert (await s.scrape_once()).version == 1
    clock.t += 0.25
    assert (await s.scrape_once()).version == 1  # same numbers, only older
    f.texts[A] = gauges(2, 0)
    assert (await s.scrape_once()).version == 2


async def test_a_silent_replica_keeps_its_last_sample_until_stale_then_reads_saturated() -> None:
    s, f, clock = make()
    f.texts = {A: gauges(1, 0), B: gauges(1, 0)}
    await s.scrape_once()
    f.texts[B] = None
    clock.t += 0.5
    b = (await s.scrape_once()).pools["chat"].endpoints[B]
    assert (b.saturation, b.stale, b.healthy) == (0.1, False, False)
    clock.t += 0.6
    b = (await s.scrape_once()).pools["chat"].endpoints[B]
    assert (b.saturation, b.stale, b.degraded) == (SATURATED, True, True)
    f.texts[B] = "{{{ garbage"
    clock.t += 0.25
    assert (await s.scrape_once()).pools["chat"].endpoints[B].stale


async def test_a_replica_whose_name_does_not_resolve_is_absent_not_saturated() -> None:
    """Kubernetes: the policy names pods up to the autoscaler's maximum; a headless Service
    answers only for ready pods. A pod not running yet must not read as a full replica."""
    s, f, clock = make()
    f.texts = {A: gauges(5, 0), B: gauges(5, 0)}
    f.unnamed = {B}
    chat = (await s.scrape_once()).pools["chat"]
    assert set(chat.endpoints) == {A} and chat.saturation == 0.5
    assert chat.capacity_running == 10
    for _ in range(8):  # long past stale_after: still absent, never stale and saturated
        clock.t += 0.25
        chat = (await s.scrape_once()).pools["chat"]
    assert set(chat.endpoints) == {A} and chat.saturation == 0.5
    f.unnamed.clear()  # the pod is ready: its name resolves, it joins with its sample
    chat = (await s.scrape_once()).pools["chat"]
    assert set(chat.endpoints) == {A, B} and chat.capacity_running == 20
    f.unnamed = {B}  # scaled down (or failed): its name goes, it leaves at once
    assert set((await s.scrape_once()).pools["chat"].endpoints) == {A}


async def test_the_http_fetcher_says_name_not_found_for_a_name_that_does_not_resolve() -> None:
    fetcher = HttpFetcher()
    try:
        with pytest.raises(NameNotFound):
            await fetcher.metrics("sglang-chat-7.sglang-chat.invalid:30000", 2.0)
        with pytest.raises(ScrapeError) as refused:  # a name that resolves: a plain error
            await fetcher.metrics("127.0.0.1:9", 2.0)
        assert not isinstance(refused.value, NameNotFound)
    finally:
        await fetcher.aclose()


async def test_capacity_comes_from_server_info_once_where_the_policy_is_silent() -> None:
    s, f, clock = make(Capacity())
    f.texts = {A: gauges(4, 0), B: gauges(4, 0)}
    f.infos = {A: {"internal_states": [{"max_running_requests": 8}], "max_queued_requests": 4}}
    state = await s.scrape_once()
    assert state.pools["chat"].endpoints[A].saturation == 0.5  # 4 of 8 running
    assert state.pools["chat"].endpoints[B].saturation == 0.0  # no capacity known: KV 0/1000
    clock.t += 0.25
    await s.scrape_once()
    assert f.info_calls.count(A) == 1 and f.info_calls.count(B) == 1  # B retried later
    clock.t += 11
    await s.scrape_once()
    assert f.info_calls.count(B) == 2


async def test_marks_follow_hysteresis_across_rounds() -> None:
    s, f, clock = make()
    marks = []
    for running, queued in [(5, 0), (10, 1), (9, 0), (10, 0), (8, 0), (9, 0)]:
        f.texts = {A: gauges(running, queued), B: gauges(0, 0)}
        clock.t += 0.25
        marks.append((await s.scrape_once()).pools["chat"].endpoints[A].degraded)
    assert marks == [False, True, True, True, False, False]


async def test_long_poll_returns_at_once_when_newer_and_wakes_on_publish() -> None:
    s, f, _ = make()
    f.texts = {A: gauges(1, 0), B: gauges(1, 0)}
    await s.scrape_once()
    assert (await s.wait_newer(0, 5)).version == 1
    waiter = asyncio.create_task(s.wait_newer(1, 30))
    await asyncio.sleep(0)
    assert not waiter.done()
    f.texts[A] = gauges(3, 0)
    await s.scrape_once()
    assert (await asyncio.wait_for(waiter, 1)).version == 2
    assert (await s.wait_newer(2, 0)).version == 2  # timeout: the current state


async def test_listeners_see_every_published_state_and_aclose_closes_the_fetcher() -> None:
    s, f, _ = make()
    seen: list[PoolState] = []
    s.subscribe(seen.append)
    f.texts = {A: gauges(1, 0), B: gauges(1, 0)}
    await s.scrape_once()
    await s.scrape_once()
    assert [st.version for st in seen] == [1]
    s.start()
    await s.aclose()
    assert f.closed


def test_targets_from_policy_reads_capacity_hysteresis_and_timing() -> None:
    policy = load_policy_text(
        "version: 1\ncontrol_plane: {pool_state: {interval: 100ms, stale_after: 2s}}\n"
        "pools:\n  chat:\n    models: [m]\n    endpoints: ['127.0.0.1:1']\n"
        "    capacity: {max_running_requests: 8}\n"
        "    saturation: {degrade_at: 1.5, recover_at: 1.0}\n"
        "  small: {models: [s], saturation: {enabled: false}}\n",
        "m.yaml",
    )
    settings, pools = targets_from_policy(policy)
    assert (settings.interval_s, settings.stale_after_s) == (0.1, 2.0)
    assert pools["chat"].endpoints == ("127.0.0.1:1",)
    assert pools["chat"].capacity == Capacity(max_running_requests=8)
    assert pools["chat"].hysteresis == Hysteresis(1.5, 1.0)
    assert pools["small"].hysteresis is None


@pytest.mark.parametrize("bad", ["after_version=x", "timeout=-1", "timeout=100"])
async def test_the_api_rejects_bad_queries_with_400(bad: str) -> None:
    from aiohttp.test_utils import make_mocked_request

    from controlplane.saturation.api import pool_routes

    s, _, _ = make()
    handler = pool_routes(s)[0].handler
    resp = await handler(make_mocked_request("GET", f"/api/v1/pools?{bad}"))
    assert resp.status == 400


async def test_the_api_long_polls_and_answers_the_documented_json() -> None:
    import json

    from aiohttp.test_utils import make_mocked_request

    from controlplane.saturation.api import pool_routes

    s, f, _ = make()
    f.texts = {A: gauges(1, 0), B: gauges(1, 0)}
    await s.scrape_once()
    handler = pool_routes(s)[0].handler
    resp = await handler(make_mocked_request("GET", "/api/v1/pools?after_version=1&timeout=0"))
    doc = json.loads(resp.text)
    assert resp.status == 200 and doc["version"] == 1
    assert doc["pools"]["chat"]["endpoints"][A]["s"] == 0.1
    assert PoolState.from_json(doc).pools["chat"].endpoints[A].running == 1


def make_ranked() -> tuple[PoolScraper, FakeFetcher, Clock, CollectorRegistry]:
    from policy.scheduling import PriorityScheduling

    fetcher, clock, registry = FakeFetcher(), Clock(), CollectorRegistry()
    s = PoolScraper(fetcher, clock=clock, wall_clock=clock, registry=registry)
    want = PriorityScheduling(enabled=True)
    s.configure(ScrapeSettings(), {"chat": PoolTargets((A, B), CAP, None, priority=want)})
    return s, fetcher, clock, registry


RANKS = {"enable_priority_scheduling": True, "priority_scheduling_preemption_threshold": 10}


async def test_each_replicas_priority_scheduling_is_published_and_a_mismatch_shown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from poolstate import Ranking

    s, f, clock, registry = make_ranked()
    f.texts = {A: gauges(1, 0), B: gauges(1, 0)}
    f.infos = {A: RANKS, B: dict(RANKS, enable_priority_scheduling=False)}
    eps = (await s.scrape_once()).pools["chat"].endpoints
    assert eps[A].ranking == Ranking(True, 10) and eps[B].ranking == Ranking(False, 10)
    doc = s.state.to_json()["pools"]["chat"]["endpoints"]
    assert doc[B]["rank"] == {"on": False, "thr": 10}

    def ranked(ep: str) -> float | None:
        return registry.get_sample_value(
            "tokenweir_replica_ranked", {"pool": "chat", "endpoint": ep}
        )

    assert (ranked(A), ranked(B)) == (1, 0)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and B in warnings[0]
    assert "--enable-priority-scheduling" in warnings[0]
    f.texts[A] = gauges(2, 0)
    clock.t += 0.25
    await s.scrape_once()  # a new version, the same mismatch: no second warning
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 1


async def test_a_replica_that_does_not_say_reads_unknown() -> None:
    s, f, _, registry = make_ranked()
    f.texts = {A: gauges(1, 0), B: gauges(1, 0)}
    f.infos = {A: {"max_running_requests": 4}}  # an older SGLang; B: no server info at all
    eps = (await s.scrape_once()).pools["chat"].endpoints
    assert not eps[A].ranking.known and not eps[B].ranking.known
    labels = {"pool": "chat", "endpoint": A}
    assert registry.get_sample_value("tokenweir_replica_ranked", labels) == -1


async def test_a_replica_back_after_an_outage_is_asked_again_how_it_ranks() -> None:
    s, f, clock, _ = make_ranked()
    f.texts = {A: gauges(1, 0), B: gauges(1, 0)}
    f.infos = {A: RANKS, B: RANKS}
    await s.scrape_once()
    clock.t += 0.25
    await s.scrape_once()
    assert f.info_calls.count(A) == 1  # once while it keeps answering
    f.texts[A] = None  # it stops answering; it comes back started without the flag
    clock.t += 0.25
    await s.scrape_once()
    f.texts[A], f.infos[A] = gauges(1, 0), dict(RANKS, enable_priority_scheduling=False)
    clock.t += 0.25
    state = await s.scrape_once()
    assert f.info_calls.count(A) == 2
    assert state.pools["chat"].endpoints[A].ranking.enabled is False


def test_targets_carry_the_declared_priority_scheduling_of_pools_that_enable_it() -> None:
    policy = load_policy_text(
        "version: 1\npools:\n"
        "  chat: {models: [m], endpoints: ['127.0.0.1:1'], priority_scheduling: {enabled: true}}\n"
        "  plain: {models: [p], endpoints: ['127.0.0.1:2']}\n",
        "m.yaml",
    )
    _, pools = targets_from_policy(policy)
    assert pools["chat"].priority is not None and pools["chat"].priority.preemption_threshold == 10
    assert pools["plain"].priority is None


async def test_a_vllm_pool_is_read_by_vllm_names_and_never_asked_for_server_info() -> None:
    fetcher, clock = FakeFetcher(), Clock()
    s = PoolScraper(fetcher, clock=clock, wall_clock=clock, registry=CollectorRegistry())
    s.configure(ScrapeSettings(), {"chat": PoolTargets((A,), CAP, None, backend="vllm")})
    fetcher.texts = {
        A: (
            'vllm:num_requests_running{engine="0",model_name="m"} 10\n'
            'vllm:num_requests_waiting{engine="0",model_name="m"} 5\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
        )
    }
    a = (await s.scrape_once()).pools["chat"].endpoints[A]
    assert (a.running, a.queued, a.token_usage, a.saturation, a.stale) == (10, 5, 0.5, 1.5, False)
    assert fetcher.info_calls == []
    fetcher.texts[A] = gauges(1, 0)  # SGLang's names on a vllm pool: not an answer
    clock.t += 2
    assert (await s.scrape_once()).pools["chat"].endpoints[A].stale


def test_the_pools_backend_reaches_the_scrape_targets() -> None:
    policy = load_policy_text(
        "version: 1\npools:\n  chat:\n    backend: vllm\n    models: [m]\n"
        "    endpoints: [127.0.0.1:1]\n    capacity: {max_running_requests: 4}\n"
    )
    _, targets = targets_from_policy(policy)
    assert targets["chat"].backend == "vllm" and targets["chat"].capacity.max_running_requests == 4


async def test_replicas_starting_are_published_with_when_the_first_should_serve() -> None:
    """Issue 42 part 3: the pool state says a scale-up is under way, in whole wall-clock
    seconds, so a steady estimate does not bump the version each round."""
    s, f, clock = make()
    f.texts = {A: gauges(1, 0), B: gauges(1, 0)}
    first = await s.scrape_once()
    assert first.pools["chat"].starting == 0 and first.pools["chat"].ready_at is None
    s.set_starting("chat", 2, 19.6)  # wall clock 100.0: ready at 119.6, published as 120
    chat = (await s.scrape_once()).pools["chat"]
    assert (chat.starting, chat.ready_at, s.state.version) == (2, 120.0, 2)
    clock.t += 0.25
    s.set_starting("chat", 2, 19.35)  # the same moment, estimated a round later
    assert (await s.scrape_once()).version == 2
    assert s.state.pools["chat"].to_json()["starting"] == 2
    s.set_starting("chat", 0, None)  # they serve now
    chat = (await s.scrape_once()).pools["chat"]
    assert (chat.starting, chat.ready_at, s.state.version) == (0, None, 3)
