"""The degrade plugin, its ladders and the tokens plugin's clamp and model rewrite, on a fake
clock and a fake saturation source (no network)."""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import pytest
from prometheus_client import generate_latest

from filters.api import Context, RouteInfo
from filters.plugins.admission.gate import Gates
from filters.plugins.admission.plugin import AdmissionPlugin
from filters.plugins.degrade.plugin import DEGRADE_HEADER, DegradePlugin
from filters.plugins.degrade.state import Ladders, uses_ladder
from filters.plugins.tokens.plugin import TokensPlugin
from policy import Policy, load_policy_text
from tests.filters.conftest import FakeClock, make_services

POLICY = """
version: 1
filters: {}
pools:
  chat:
    models: [big]
    endpoints: [127.0.0.1:9001]
    fallback: small
    capacity: {max_running_requests: 1}
    degradation:
      min_dwell: 5s
      steps:
        - {action: clamp_max_tokens, enter_at: 0.8, leave_at: 0.6, tiers: [free], max_tokens: 32}
        - {action: fallback, enter_at: 1.0, leave_at: 0.8, tiers: [free]}
        - {action: shed, enter_at: 1.5, leave_at: 1.2, lanes: [batch]}
  small:
    models: [tiny]
    endpoints: [127.0.0.1:9002]
    capacity: {max_running_requests: 4}
gateways:
  edge:
    routes:
      - name: llm
        pool: chat
        filters: {plugins: [identity, lane, degrade, admission, tokens]}
tiers:
  pro: {lane: interactive, max_tokens: 1000}
  free: {lane: batch, max_tokens: 1000}
"""
ROUTE = RouteInfo(name="llm", pool="chat", models=("big",))


class Setup:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.policy: Policy = load_policy_text(POLICY)
        self.level: float | None = 0.0
        services = make_services(self.policy, self.clock)
        self.ladders = Ladders(clock=self.clock, registry=services.metrics.registry)
        self.ladders.configure(self.policy)
        self.ladders.saturation = lambda pool: self.level if pool == "chat" else None
        self.gates = Gates(clock=self.clock, wall=self.clock)
        self.gates.configure(self.policy)
        self.services = replace(services, ladders=self.ladders, gates=self.gates)
        self.plugin = DegradePlugin({}, self.services)
        self.tokens = TokensPlugin({}, self.services)

    def ctx(self, tier: str, lane: str) -> Context:
        c = Context(route=ROUTE, started=self.clock(), method="POST", path="/v1/chat/completions")
        c.tenant, c.tier, c.lane = "t-" + tier, tier, lane
        return c

    def metrics(self) -> str:
        return generate_latest(self.services.metrics.registry).decode()


@pytest.fixture
def s() -> Setup:
    return Setup()


BODY = json.dumps({"model": "big", "messages": [{"role": "user", "content": "hi"}],
                   "max_tokens": 500}).encode()  # fmt: skip


async def test_normal_service_changes_nothing(s: Setup) -> None:
    ctx = s.ctx("free", "batch")
    assert await s.plugin.request_headers(ctx, {}, False) is None
    out = await s.tokens.request_body(ctx, BODY)
    assert out is not None and out.body is None and ctx.max_tokens == 500


async def test_step_one_clamps_lower_tiers_and_shrinks_the_reservation(s: Setup) -> None:
    s.level = 0.9
    free, pro = s.ctx("free", "batch"), s.ctx("pro", "interactive")
    assert await s.plugin.request_headers(free, {}, False) is None
    out = await s.tokens.request_body(free, BODY)
    assert out is not None and out.body is not None
    assert json.loads(out.body)["max_tokens"] == 32 and free.max_tokens == 32
    assert out.set_headers["x-tokenweir-reserve"] == str(free.prompt_tokens + 32)
    resp = await s.plugin.response_headers(free, {})
    assert resp is not None and resp.set_headers["x-tokenweir-degraded"] == "clamp_max_tokens"
    # a higher tier is untouched
    assert await s.plugin.request_headers(pro, {}, False) is None
    await s.tokens.request_body(pro, BODY)
    assert pro.max_tokens == 500
    assert await s.plugin.response_headers(pro, {}) is None
    assert 'tokenweir_filters_ladder_step{pool="chat"} 1.0' in s.metrics()


async def test_step_two_sends_lower_tiers_to_the_fallback_model(s: Setup) -> None:
    s.level = 1.1
    ctx = s.ctx("free", "batch")
    out = await s.plugin.request_headers(ctx, {}, False)
    assert out is not None and out.set_headers == {DEGRADE_HEADER: "fallback"}
    assert out.clear_route_cache
    body = await s.tokens.request_body(ctx, BODY)
    assert body is not None and body.body is not None
    sent = json.loads(body.body)
    assert sent["model"] == "tiny" and sent["max_tokens"] == 32
    resp = await s.plugin.response_headers(ctx, {})
    assert resp is not None
    assert resp.set_headers == {
        "x-tokenweir-degraded": "clamp_max_tokens,fallback",
        "x-tokenweir-served-model": "tiny",
    }
    assert 'tokenweir_filters_ladder_requests_total{action="fallback",pool="chat"} 1.0' in (
        s.metrics()
    )


async def test_admission_gates_the_pool_that_serves_the_request(s: Setup) -> None:
    """The primary's one slot is taken: a request sent to the fallback pool is not held on it."""
    s.level = 1.1
    admission = AdmissionPlugin({}, s.services)
    first = s.ctx("pro", "interactive")
    assert await admission.request_headers(first, {}, False) is None  # takes chat's only slot
    ctx = s.ctx("free", "batch")
    await s.plugin.request_headers(ctx, {}, False)
    assert await admission.request_headers(ctx, {}, False) is None  # admitted on small at once
    assert s.gates.gate("small") is not None and s.gates.gate("small").core.in_flight == 1


async def test_step_three_sheds_lower_lanes_with_retry_after(s: Setup) -> None:
    s.level = 1.6
    s.plugin.gates = None  # no admission gate: the step's dwell alone (test_demand: with one)
    ctx = s.ctx("pro", "batch")
    out = await s.plugin.request_headers(ctx, {}, False)
    assert out is not None and out.reply is not None
    assert out.reply.status == 503
    assert out.reply.headers["retry-after"] == "5"  # the step's whole dwell is ahead
    err = json.loads(out.reply.body)["error"]
    assert err["code"] == "degraded" and "overloaded" in err["message"]
    s.clock.now += 3
    out = await s.plugin.request_headers(s.ctx("pro", "batch"), {}, False)
    assert out is not None and out.reply is not None and out.reply.headers["retry-after"] == "2"
    assert await s.plugin.request_headers(s.ctx("pro", "interactive"), {}, False) is None
    text = s.metrics()
    assert 'tokenweir_filters_ladder_requests_total{action="shed",pool="chat"} 2.0' in text
    assert 'rejections_total{reason="degraded",route="llm",status="503"} 2.0' in text
    assert 'tokenweir_filters_ladder_shed_total{lane="batch",pool="chat"} 2.0' in text


async def test_steps_down_with_hysteresis_logged_once_per_change(
    s: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "tokenweir.ladder")
    s.level = 1.6
    assert s.ladders.step("chat") == 3
    s.level = 1.3  # inside shed's band: stays
    s.clock.now += 60
    assert s.ladders.step("chat") == 3
    s.level = 0.7  # below shed and fallback leave_at, above the clamp's
    s.clock.now += 1
    assert s.ladders.step("chat") == 1  # dwell long over: down to the clamp at once
    s.level = 0.1
    assert s.ladders.step("chat") == 1  # just changed: dwells 5 s
    s.clock.now += 5
    assert s.ladders.step("chat") == 0
    for _ in range(3):
        s.ladders.step("chat")
    changes = [r for r in caplog.records if "degradation step" in r.getMessage()]
    assert [r.getMessage().split(": ")[1].split(" (")[0] for r in changes] == [
        "degradation step 0 -> 3",
        "degradation step 3 -> 1",
        "degradation step 1 -> 0",
    ]
    text = s.metrics()
    assert 'tokenweir_filters_ladder_changes_total{direction="down",pool="chat"} 2.0' in text
    assert 'tokenweir_filters_ladder_step{pool="chat"} 0.0' in text


async def test_no_pool_state_reads_as_calm(s: Setup) -> None:
    s.level = 1.6
    assert s.ladders.step("chat") == 3
    s.level = None  # the control plane went silent
    s.clock.now += 5
    assert s.ladders.step("chat") == 0


def test_uses_ladder_and_a_reload_keeps_the_step(s: Setup) -> None:
    assert uses_ladder(s.policy)
    s.level = 1.6
    assert s.ladders.step("chat") == 3
    s.ladders.configure(s.policy)  # same ladder: same step
    s.level = 1.3
    assert s.ladders.step("chat") == 3
    plain = load_policy_text(POLICY.replace("degrade, ", ""))
    assert not uses_ladder(plain)
