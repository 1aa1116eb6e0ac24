"""Money: what a request costs at the policy's prices (``prices.<model>``, USD per 1k tokens).

The batch runner's lines pay ``batch.price_factor`` of those prices (OpenAI's Batch API
discount; docs/batch.md "Batch price"): each function takes the request's ``factor``
(:func:`price_factor`).

Amounts that are charged against budgets are integers in micro-USD (1 USD = 1,000,000), so the
Lua scripts and their Python twin add integers exactly. Pure functions; docs/quotas.md "Money".
"""

from __future__ import annotations

import math

from policy.batch_checks import batch_line_routes
from policy.model import Policy
from policy.tenancy import Price

__all__ = ["MICRO", "cost_usd", "micro_usd", "price_factor", "price_for", "worst_case_micro_usd"]

MICRO = 1_000_000


def price_factor(policy: Policy, route: str | None) -> float:
    """What share of the prices a request of ``route`` pays: ``batch.price_factor`` on the
    routes that take the batch runner's lines (policy/batch_checks.py), else 1."""
    b = policy.batch
    if b is None or b.price_factor == 1.0 or route is None:
        return 1.0
    return b.price_factor if route in batch_line_routes(policy) else 1.0


def price_for(policy: Policy, model: str | None, factor: float = 1.0) -> Price | None:
    """The model's price times ``factor``; None for a model without a price."""
    p = policy.prices.get(model) if model is not None else None
    if p is None or factor == 1.0:
        return p
    cached = None if p.cached is None else p.cached * factor
    return Price(prompt=p.prompt * factor, completion=p.completion * factor, cached=cached)


def cost_usd(
    policy: Policy, model: str | None, prompt: int, completion: int, cached: int = 0,
    factor: float = 1.0,
) -> float:  # fmt: skip
    """USD of one request's reported usage; 0 for a model without a price. Cached prompt tokens
    are billed at the ``cached`` price (the prompt price when unset), the rest at ``prompt``."""
    p = price_for(policy, model, factor)
    if p is None:
        return 0.0
    cached = max(0, min(cached, prompt))
    cached_price = p.prompt if p.cached is None else p.cached
    return ((prompt - cached) * p.prompt + cached * cached_price + completion * p.completion) / 1000


def micro_usd(
    policy: Policy, model: str | None, prompt: int, completion: int, cached: int = 0,
    factor: float = 1.0,
) -> int:  # fmt: skip
    """:func:`cost_usd` in whole micro-USD, rounded up (a budget never undercounts)."""
    return math.ceil(cost_usd(policy, model, prompt, completion, cached, factor) * MICRO - 1e-6)


def worst_case_micro_usd(
    policy: Policy, model: str | None, tokens: int, factor: float = 1.0
) -> int:
    """Every token at the dearest of the prompt and completion prices: the reservation, when
    only a token total is known (the reserve's ``hits_addend``, or a settle without usage)."""
    p = price_for(policy, model, factor)
    if p is None or tokens <= 0:
        return 0
    return math.ceil(tokens * max(p.prompt, p.completion) * 1000 - 1e-6)
