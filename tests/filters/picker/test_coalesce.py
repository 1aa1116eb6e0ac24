"""Prefill coalescing (routing.coalesce_wait): a request sent where its new prefix is being
prefilled right now waits for that prefill; the leads, the waits' outcomes, the pool's wiring
and the ext_proc hold it needs (fake clock, the emulator's radix cache as the replicas'; no
network)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2
from prometheus_client import CollectorRegistry

from backends.emulator.tokenizer import encode
from controlplane.translate.ext_proc import ext_proc_http_filter
from filters.api import Context, RouteInfo
from filters.plugins.picker.coalesce import Lead, Leads, follow
from filters.plugins.picker.plugin import PickerPlugin
from filters.plugins.picker.registry import Pickers
from filters.plugins.picker.score import Pick
from policy import load_policy_text
from tests.filters.picker.test_pool import NAMES, Clock, _picker, _publish, _text

# ---- the registry and the wait, alone ---------------------------------------------------------


def test_a_lead_holds_nobody_once_it_ended_or_its_deadline_passed() -> None:
    leads = Leads(max_entries=3)
    lead = Lead("r1", target=100, until=10.0)
    leads.add(lead, [b"m1", b"m2"])
    assert leads.get("r1", b"m2", now=5.0) is lead
    assert leads.get("r2", b"m2", now=5.0) is None  # another replica: nothing prefills it there
    assert leads.get("r1", b"m2", now=10.0) is None  # its deadline
    lead.done = True
    assert leads.get("r1", b"m1", now=5.0) is None
    leads.add(Lead("r1", 0, 10.0), [b"a", b"b", b"c"])  # bounded: the oldest entries go first
    assert len(leads) == 3 and leads.get("r1", b"m1", now=0.0) is None


async def test_a_wait_ends_on_the_index_the_stored_count_the_leads_end_or_its_deadline() -> None:
    clock = Clock()

    async def sleep(s: float) -> None:
        clock.now += s

    stored = [0]

    def count() -> int:
        return stored[0]

    def lead() -> Lead:
        return Lead("r1", target=50, until=clock.now + 1.0)

    seen = [True]
    assert await follow(lead(), count, clock, sleep, indexed=lambda: seen[0]) == "indexed"
    seen[0] = False
    stored[0] = 50
    assert await follow(lead(), count, clock, sleep, indexed=lambda: seen[0]) == "stored"
    stored[0] = 0
    ended = lead()
    ended.done = True
    assert await follow(ended, count, clock, sleep) == "ended"
    t0 = clock.now
    assert await follow(lead(), count, clock, sleep) == "timed_out"
    assert clock.now - t0 == pytest.approx(1.0)  # never past the lead's deadline


# ---- in the pool's picker ---------------------------------------------------------------------


def test_a_request_for_a_prefix_being_prefilled_follows_its_lead_and_stays_on_its_replica() -> None:
    clock = Clock()
    picker, caches = _picker(clock, pending_ttl=1.0, coalesce_wait=1.0)
    doc = _text("doc", 300)
    first = picker.prompt(doc + b" first question")
    pick, wait = picker.pick_and_lead(first)
    assert wait is None and pick.replica is not None  # nobody prefills it yet
    owner = pick.replica
    uncached, lead = picker.record_lead(first, pick)
    assert lead is not None and lead.replica == owner and uncached > 0
    picker.map.extend(first.data, first.marks, 0, len(first.marks))  # the mapper caught up
    # the index does not have it yet: by load alone the next one would go to an idle replica
    second = picker.prompt(doc + b" second question")
    follow_pick, wait = picker.pick_and_lead(second)
    assert (follow_pick.replica, follow_pick.reason) == (owner, "cache")
    assert wait is not None and wait.lead is lead
    assert not picker.indexed(second, owner, wait.marks)  # not stored yet
    caches[owner].insert(encode((doc + b" first question").decode()))  # its prefill ends
    _publish(picker, owner, caches[owner], 1)
    assert picker.indexed(second, owner, wait.marks)  # the follower may go
    picker.done(owner, uncached, lead)
    assert picker.pick_and_lead(picker.prompt(doc + b" third"))[1] is None  # it ended


def test_no_lead_for_a_short_new_part_and_none_when_coalescing_is_off() -> None:
    clock = Clock()
    picker, _ = _picker(clock, pending_ttl=1.0, min_prefix_tokens=32)
    short = picker.prompt(_text("tiny", 10))
    pick = picker.pick(short)
    assert picker.record_lead(short, pick)[1] is None  # under min_prefix_tokens to prefill
    off, _ = _picker(clock, pending_ttl=1.0, coalesce_wait=0.0)
    doc = off.prompt(_text("doc", 300))
    assert off.record_lead(doc, off.pick(doc))[1] is None
    assert off.pick_and_lead(off.prompt(_text("doc", 300) + b" more"))[1] is None


def test_record_alone_leads_nobody() -> None:
    """``record`` (no ``done`` with a lead to come) must not leave a lead that holds others."""
    clock = Clock()
    picker, _ = _picker(clock, pending_ttl=1.0)
    doc = picker.prompt(_text("doc", 300))
    picker.record(doc, Pick(NAMES[0], "load"))
    assert len(picker.leads) == 0


# ---- the hold Envoy must allow ----------------------------------------------------------------

POLICY = """
version: 1
filters: {address: 127.0.0.1:18082, message_timeout: 300ms}
pools:
  chat:
    models: [m1]
    endpoints: [127.0.0.1:9000]
    routing: {mode: prefix_index, coalesce_wait: COALESCE}
gateways:
  edge:
    routes:
      - {name: llm, pool: chat, match: {prefix: /v1/}, filters: {plugins: [tokens, picker]}}
"""


def test_envoy_may_wait_for_the_picker_as_long_as_coalesce_wait_allows() -> None:
    cfg = ext_proc_pb2.ExternalProcessor()
    policy = load_policy_text(POLICY.replace("COALESCE", "1500ms"))
    assert ext_proc_http_filter(policy).typed_config.Unpack(cfg)
    assert cfg.max_message_timeout.ToMilliseconds() == 3500  # 1.5 s + 2 s slack
    off = ext_proc_pb2.ExternalProcessor()
    assert ext_proc_http_filter(
        load_policy_text(POLICY.replace("COALESCE", "0s"))
    ).typed_config.Unpack(off)
    assert not off.HasField("max_message_timeout")


# ---- the plugin: Envoy told to wait, the wait counted -----------------------------------------


async def test_the_plugin_holds_envoy_for_the_lead_and_counts_how_the_wait_ended() -> None:
    clock = Clock()
    picker, _ = _picker(clock, pending_ttl=1.0, coalesce_wait=2.0)
    registry = CollectorRegistry()
    pickers = Pickers(registry=registry)
    pickers._pools["chat"] = (None, picker)
    plugin = PickerPlugin({}, SimpleNamespace(pickers=pickers))  # type: ignore[arg-type]
    route = RouteInfo(name="llm", pool="chat", models=("m",))
    body = json.dumps({"text": _text("doc", 300).decode()}).encode()
    held: list[float] = []

    async def hold(seconds: float) -> None:
        held.append(seconds)

    def ctx() -> Context:
        c = Context(route=route, started=clock(), method="POST", path="/generate")
        c.hold = hold
        return c

    lead_ctx = ctx()
    first = await plugin.request_body(lead_ctx, body)
    assert first is not None and held == []  # the lead itself never waits
    follower = asyncio.ensure_future(plugin.request_body(ctx(), body))
    await asyncio.sleep(0.02)
    assert not follower.done() and held == [2.0]  # Envoy told to wait as long as the lead may
    await plugin.stream_end(lead_ctx)  # the lead's request ended
    out = await asyncio.wait_for(follower, 1.0)
    assert out is not None
    assert out.set_headers == first.set_headers  # to the lead's replica
    assert (
        registry.get_sample_value(
            "tokenweir_picker_coalesced_total", {"pool": "chat", "outcome": "ended"}
        )
        == 1.0
    )
