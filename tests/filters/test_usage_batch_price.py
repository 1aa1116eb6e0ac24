"""The batch runner's lines pay ``batch.price_factor`` of the prices (examples/mesh.yaml: 0.5)
in the settle descriptor's ``usd``, the cost metric and Envoy's meter inputs; every other
route pays the whole price (issue 41)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from filters.api import RouteInfo
from filters.plugins.usage.plugin import UsagePlugin
from filters.services import Services
from policy import Policy
from quota.cost import micro_usd, price_factor, worst_case_micro_usd
from tests.filters.conftest import ROUTE, make_ctx

LINES = replace(ROUTE, name="batch-lines", lane="batch")  # the example's route for the runner
USAGE = {"prompt_tokens": 1000, "completion_tokens": 500,
         "prompt_tokens_details": {"cached_tokens": 400}}  # fmt: skip


async def settle(services: Services, route: RouteInfo) -> dict[str, object]:
    ctx = make_ctx(route=route, tenant="demo-pro", model="llama-3.1-8b", prompt_tokens=1000)
    plugin = UsagePlugin({}, services)
    r = await plugin.response_chunk(ctx, json.dumps({"usage": USAGE}).encode(), True)
    assert r is not None
    await plugin.stream_end(ctx)
    return dict(r.metadata)


def spent(services: Services) -> float | None:
    return services.metrics.registry.get_sample_value(
        "tokenweir_filters_cost_usd_total",
        {"tenant": "demo-pro", "cost_center": "research", "model": "llama-3.1-8b"},
    )


async def test_a_batch_line_settles_at_the_batch_price(services: Services) -> None:
    services.metrics.configure(services.policy)  # what the app does (label folding)
    # whole price: 600 x 0.2 + 400 x 0.1 + 500 x 0.6 = 460 micro-USD; a batch line half of it
    assert (await settle(services, ROUTE))["settle_usd_micros"] == "460"
    assert spent(services) == pytest.approx(0.00046)
    md = await settle(services, LINES)
    assert md["settle_usd_micros"] == "230" and md["cost_usd"] == 0.00023
    assert spent(services) == pytest.approx(0.00046 + 0.00023)


def test_the_meter_inputs_carry_the_lines_price(services: Services) -> None:
    plugin = UsagePlugin({}, services)
    whole = plugin.envoy_inputs(make_ctx(model="llama-3.1-8b"))
    half = plugin.envoy_inputs(make_ctx(route=LINES, model="llama-3.1-8b"))
    for k in ("price_prompt", "price_cached", "price_completion"):
        assert half[k] == pytest.approx(whole[k] * 0.5), k


def test_only_the_lines_route_and_only_with_a_factor(policy: Policy) -> None:
    assert price_factor(policy, "batch-lines") == 0.5
    assert price_factor(policy, "chat-completions") == 1.0 and price_factor(policy, None) == 1.0
    assert policy.batch is not None
    whole = replace(policy, batch=replace(policy.batch, price_factor=1.0))
    assert price_factor(whole, "batch-lines") == 1.0
    assert price_factor(replace(policy, batch=None), "batch-lines") == 1.0
    m = "llama-3.1-8b"
    assert micro_usd(policy, m, 1000, 500, 400, factor=0.5) == 230
    assert worst_case_micro_usd(policy, m, 1000, factor=0.5) == 300  # 1000 x 0.6 / 2
