"""Collapsing without network: the hub's fan-out order, bounds and forgetting; the plugin's
choice of leader and followers; the translation's follower route and cluster."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest

from controlplane.translate import render
from filters.errors import ConfigError
from filters.plugins.collapse.hub import Hub
from filters.plugins.collapse.plugin import CollapsePlugin, is_deterministic, replica_order
from policy import Policy, load_policy_text
from policy.phases import COLLAPSE_ID_HEADER, COLLAPSE_TO_HEADER
from tests.filters.conftest import ROUTE, FakeClock, make_ctx, make_services


async def test_a_follower_gets_every_chunk_from_the_first_as_it_comes() -> None:
    hub = Hub(FakeClock(), address="127.0.0.1:9")
    run = hub.lead("k")
    run.headers(200, "text/event-stream")
    run.feed(b"a", limit=100)
    assert hub.join("k", max_followers=2) is run
    got: list[bytes] = []

    async def read() -> None:
        async for c in run.follow(5.0):
            got.append(c)

    task = asyncio.create_task(read())
    await asyncio.sleep(0)
    assert got == [b"a"]  # what the leader already had, at once
    run.feed(b"b", limit=100)
    await asyncio.sleep(0)
    assert got == [b"a", b"b"]  # the next chunk as soon as it is fed, before the end
    hub.finish(run, complete=True)
    await task
    assert got == [b"a", b"b"] and run.complete


def test_joins_are_bounded_and_runs_forgotten() -> None:
    clock = FakeClock()
    hub = Hub(clock, address="127.0.0.1:9", linger=10)
    run = hub.lead("k")
    assert hub.join("k", max_followers=1) is run
    assert hub.join("k", max_followers=1) is None  # max_followers
    other = hub.lead("j")
    other.feed(b"x" * 50, limit=10)
    assert hub.join("j", max_followers=5) is None  # past the buffer bound
    hub.finish(run, complete=True)
    assert hub.join("k", max_followers=5) is None  # done: nothing to join
    assert hub.attach(run.id) is run  # a caller on its way still reads it
    hub.detach(run)
    hub.leave(run)
    assert hub.attach(run.id) is run  # one member is still open
    hub.detach(run)
    hub.leave(run)
    assert hub.attach(run.id) is None  # read by all, every member gone: forgotten
    hub.finish(other, complete=False)
    clock.now += 11
    hub.lead("z")  # sweeps
    assert hub.attach(other.id) is None
    assert Hub(clock).join("z", max_followers=5) is None  # no fan-out endpoint: no followers


def test_the_origin_runs_while_any_caller_remains_and_stops_when_none_does() -> None:
    clock = FakeClock()
    hub = Hub(clock, address="127.0.0.1:9")
    idle: list[str] = []
    hub.on_idle = lambda r: idle.append(r.id)
    run = hub.lead("k")  # the leader, a member
    assert hub.join("k", max_followers=3) is run
    for _ in range(2):
        assert hub.attach(run.id) is run
    run.started = True
    hub.detach(run)  # the leader's client went away ...
    hub.leave(run)
    assert not run.done and idle == []  # ... the follower still reads: the origin goes on
    remote = hub.attach(run.id)  # a caller of another filter process (no member here)
    assert remote is run
    hub.detach(run)
    hub.leave(run)
    assert not run.done and idle == []  # the remote reader keeps it running
    hub.detach(run)
    assert run.done and not run.complete and idle == [run.id]  # nobody left: cancelled
    never = hub.lead("j")  # a leader refused before the fan-out (never started)
    hub.leave(never)
    assert never.done and idle == [run.id] and hub.attach(never.id) is None


def test_a_published_run_lingers_briefly_for_followers_of_other_processes() -> None:
    clock = FakeClock()
    hub = Hub(clock, address="127.0.0.1:9", remote_linger=5)
    unpublished: list[str] = []
    hub.on_finish = lambda r: unpublished.append(r.id)
    run = hub.lead("k")
    run.published = True
    run.feed(b"all", limit=100)
    hub.finish(run, complete=True)
    hub.leave(run)
    assert unpublished == [run.id]
    assert hub.attach(run.id) is run  # a remote follower that read the registry just before
    hub.detach(run)
    clock.now += 6
    hub.lead("z")
    assert hub.attach(run.id) is None


@pytest.mark.parametrize(
    ("body", "want"),
    [
        ({"temperature": 0}, True),
        ({"temperature": 0.0}, True),
        ({"seed": 3, "temperature": 0.9}, True),
        ({"sampling_params": {"temperature": 0}}, True),
        ({"temperature": 0.5}, False),
        ({}, False),
        ({"seed": True}, False),
        ({"temperature": False}, False),
    ],
)
def test_deterministic_means_temperature_zero_or_a_seed(body: dict[str, Any], want: bool) -> None:
    assert is_deterministic(body) is want


def plugin(policy: Policy, clock: FakeClock, hub: Hub, **knobs: Any) -> CollapsePlugin:
    p = dataclasses.replace(policy, collapsing=dataclasses.replace(policy.collapsing, **knobs))
    return CollapsePlugin({}, dataclasses.replace(make_services(p, clock), collapser=hub))


async def test_the_plugin_points_the_leader_and_its_followers_at_the_fanout(
    policy: Policy, clock: FakeClock
) -> None:
    hub = Hub(clock, address="127.0.0.1:9")
    p = plugin(policy, clock, hub)
    body = json.dumps({"model": "m", "temperature": 0, "messages": []}).encode()
    lead = make_ctx(tenant="acme", route=ROUTE)
    lead.request_headers = {":path": "/v1/chat/completions", "authorization": "Bearer k",
                            "x-tokenweir-tenant": "acme", "content-type": "application/json"}  # fmt: skip
    r = await p.request_body(lead, body)
    assert r is not None and r.set_headers[COLLAPSE_TO_HEADER] == "127.0.0.1:9"
    run = lead.scratch["collapse"][1]
    assert r.set_headers[COLLAPSE_ID_HEADER] == run.id
    assert run.origin is not None and run.origin.body == body
    assert dict(run.origin.headers) == {"authorization": "Bearer k",
                                        "content-type": "application/json"}  # fmt: skip
    assert set(run.origin.endpoints) == {str(e) for e in policy.pools["chat"].endpoints}
    follower = make_ctx(tenant="acme", route=ROUTE)
    r = await p.request_body(follower, body)
    assert r is not None and r.clear_route_cache
    assert r.set_headers[COLLAPSE_ID_HEADER] == run.id
    other = await p.request_body(make_ctx(tenant="globex", route=ROUTE), body)
    assert other is not None and other.set_headers[COLLAPSE_ID_HEADER] != run.id
    shared = plugin(policy, clock, Hub(clock, address="127.0.0.1:9"), share_across_tenants=True)
    first = await shared.request_body(make_ctx(tenant="acme", route=ROUTE), body)
    second = await shared.request_body(make_ctx(tenant="globex", route=ROUTE), body)
    assert first is not None and second is not None
    assert first.set_headers[COLLAPSE_ID_HEADER] == second.set_headers[COLLAPSE_ID_HEADER]
    hot = json.dumps({"model": "m", "temperature": 0.7, "messages": []}).encode()
    assert await p.request_body(make_ctx(tenant="acme", route=ROUTE), hot) is None
    await p.stream_end(lead)
    await p.stream_end(follower)
    assert run.done and not run.complete  # both left before the fan-out: never started
    with pytest.raises(ConfigError):
        CollapsePlugin({"x": 1}, make_services(policy, clock))


def test_identical_requests_try_the_same_replica_first() -> None:
    eps = ("h:1", "h:2", "h:3", "h:4")
    assert replica_order("a", eps) == replica_order("a", tuple(reversed(eps)))
    assert sorted(replica_order("a", eps)) == sorted(eps)
    assert len({replica_order(k, eps)[0] for k in "abcdefghij"}) > 1


POLICY = """
version: 1
filters: {address: 127.0.0.1:18082}
pools: {chat: {models: [m1], endpoints: [127.0.0.1:30000]}}
gateways:
  edge:
    routes:
      - name: llm
        pool: chat
        filters: {plugins: [identity, tokens, collapse, usage], failure_mode: FAIL}
"""


def test_translation_adds_the_follower_route_and_cluster() -> None:
    res = render.render(load_policy_text(POLICY.replace("FAIL", "closed")))["edge"]
    cluster = res[render.CLUSTER]["tokenweir_collapse"]
    assert cluster.original_dst_lb_config.http_header_name == COLLAPSE_TO_HEADER
    routes = next(iter(res[render.ROUTE].values())).virtual_hosts[0].routes
    follower = next(r for r in routes if r.name == "llm/collapsed")
    assert follower.route.cluster == "tokenweir_collapse"
    assert [h.name for h in follower.match.headers] == [COLLAPSE_TO_HEADER]
    names = [r.name for r in routes]
    assert names.index("llm/collapsed") < names.index("llm")


def test_an_open_route_cannot_collapse() -> None:
    with pytest.raises(Exception, match="collapse plugin needs failure_mode: closed"):
        load_policy_text(POLICY.replace("FAIL", "open"))


class SlowRegistry:
    """A Redis stand-in for the registry: ``SET NX GET`` that takes a while to answer."""

    def __init__(self, existing: dict[str, bytes] | None = None) -> None:
        self.data = dict(existing or {})

    async def set(self, key: str, value: str, **kw: Any) -> bytes | None:
        await asyncio.sleep(0.01)
        old = self.data.get(key)
        if not kw.get("nx") or old is None:
            self.data[key] = value.encode()
        return old if kw.get("get") else None


async def test_identical_requests_arriving_while_the_registry_answers_still_collapse(
    policy: Policy, clock: FakeClock
) -> None:
    hub = Hub(clock, address="127.0.0.1:9")
    redis = SlowRegistry()
    p = CollapsePlugin({}, dataclasses.replace(make_services(policy, clock), collapser=hub,
                                               redis=redis))  # fmt: skip
    body = json.dumps({"model": "m", "temperature": 0, "messages": []}).encode()
    ctxs = [make_ctx(tenant="acme", route=ROUTE) for _ in range(3)]
    got = await asyncio.gather(*(p.request_body(c, body) for c in ctxs))
    assert len({r.set_headers[COLLAPSE_ID_HEADER] for r in got if r is not None}) == 1
    assert [c.scratch["collapse"][0] for c in ctxs] == ["leader", "follower", "follower"]
    run = ctxs[0].scratch["collapse"][1]
    assert run.published and redis.data == {
        f"tw:{{collapse}}:{run.key}": f"127.0.0.1:9 {run.id}".encode()
    }


async def test_a_run_another_process_leads_is_read_from_its_fanout(
    policy: Policy, clock: FakeClock
) -> None:
    body = json.dumps({"model": "m", "temperature": 0, "messages": []}).encode()
    hub = Hub(clock, address="127.0.0.1:9")
    p = CollapsePlugin({}, dataclasses.replace(make_services(policy, clock), collapser=hub,
                                               redis=SlowRegistry()))  # fmt: skip
    ctx = make_ctx(tenant="acme", route=ROUTE)
    await p.request_body(ctx, body)
    mine = ctx.scratch["collapse"][1]
    other_hub = Hub(clock, address="127.0.0.1:10")
    registry = SlowRegistry({f"tw:{{collapse}}:{mine.key}": f"127.0.0.1:9 {mine.id}".encode()})
    q = CollapsePlugin({}, dataclasses.replace(make_services(policy, clock), collapser=other_hub,
                                               redis=registry))  # fmt: skip
    ctx2 = make_ctx(tenant="acme", route=ROUTE)
    r = await q.request_body(ctx2, body)
    role, run = ctx2.scratch["collapse"]
    assert (
        role == "follower" and r is not None and r.set_headers[COLLAPSE_TO_HEADER] == "127.0.0.1:10"
    )
    assert run.origin.endpoints == ("127.0.0.1:9",)  # read from the leader's fan-out
    assert run.origin.headers == ((COLLAPSE_ID_HEADER, mine.id),)
    assert run.origin.fallback is not None and not run.published
