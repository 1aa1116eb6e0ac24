"""A batch line's reservation is made at the batch price (``batch.price_factor``, issue 41):
the rate-limit service prices the worst case of a call naming a batch-line route with the same
function the settlement uses (quota.cost.price_factor), so a tenant's usd budget admits as
many batch lines in flight as their batch price allows."""

from __future__ import annotations

from typing import Any

from envoy.service.ratelimit.v3 import rls_pb2

from policy import load_policy_text
from quota.cost import price_factor, worst_case_micro_usd
from tests.ratelimit_service.rls import descriptor
from tests.ratelimit_service.test_money import make

OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT

YAML = """
version: 1
filters: {address: 127.0.0.1:18081}
ratelimit: {address: 127.0.0.1:18082}
services:
  batch-api: {endpoints: [127.0.0.1:18070]}
pools: {chat: {models: [big], endpoints: [127.0.0.1:30001]}}
gateways:
  edge:
    listen: 127.0.0.1:10000
    routes:
      - name: batch-jobs
        match: {prefix: /v1/batches}
        service: batch-api
        filters: {plugins: [{name: identity, settings: {forward_authorization: true}}]}
      - name: batch-lines
        match: {prefix: /v1/, headers: {x-batch-line: "1"}}
        pool: chat
        lane: batch
        rate_limit: {enabled: true}
        filters: {plugins: [identity, idempotency, lane, tokens, usage]}
      - name: llm
        match: {prefix: /v1/}
        pool: chat
        rate_limit: {enabled: true}
        filters: {plugins: [identity, tokens, lane, usage]}
batch: {service: batch-api, gateway: edge, pool: chat, price_factor: 0.5, runner: {replicas: 0}}
prices:
  big: {prompt: 1.0, completion: 2.0}   # USD per 1k tokens
tiers:
  paid:
    quotas: {usd: {per_day: 1.0}}
tenants:
  acme: {tier: paid}
"""


def req(hits: int, rid: str, route: str | None, phase: str = "reserve") -> Any:
    entries = {"tenant": "acme", "model": "big", "lane": "batch", "request_id": rid}
    if route is not None:
        entries["route"] = route
    entries["phase"] = phase
    return rls_pb2.RateLimitRequest(domain="tokenweir", descriptors=[descriptor(entries, hits)])


def test_the_factor_is_the_batch_routes_only() -> None:
    policy = load_policy_text(YAML)
    assert price_factor(policy, "batch-lines") == 0.5
    assert price_factor(policy, "llm") == price_factor(policy, None) == 1.0
    assert worst_case_micro_usd(policy, "big", 400, 0.5) == 400_000


async def test_a_budget_admits_the_batch_lines_its_batch_price_allows() -> None:
    d, _ = make(load_policy_text(YAML))
    # 400 tokens: $0.80 at the whole price, $0.40 at the batch price; the day holds $1.00
    assert (await d.decide(req(400, "a", "batch-lines"))).overall_code == OK
    assert (await d.decide(req(400, "b", "batch-lines"))).overall_code == OK
    assert (await d.decide(req(400, "c", "batch-lines"))).overall_code == OVER  # 1.20 > 1
    # a settle without a price charges the batch worst case too: $0.40 of line a stays
    await d.decide(req(400, "a", "batch-lines", phase="settle"))
    assert (await d.decide(req(400, "c", "batch-lines"))).overall_code == OVER
    e, _ = make(load_policy_text(YAML))
    assert (await e.decide(req(400, "a", "llm"))).overall_code == OK  # interactive: $0.80
    assert (await e.decide(req(400, "b", "llm"))).overall_code == OVER
    f, _ = make(load_policy_text(YAML))
    assert (await f.decide(req(400, "a", None))).overall_code == OK  # no route named: whole
    assert (await f.decide(req(400, "b", "batch-lines"))).overall_code == OVER  # 0.8 + 0.4
