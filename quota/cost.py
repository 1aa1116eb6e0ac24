"""Money: what a request costs at the policy's prices (``prices.<model>``, USD per 1k tokens).

Amounts that are charged against budgets are integers in micro-USD (1 USD = 1,000,000), so the
Lua scripts and their Python twin add integers exactly. Pure functions; docs/quotas.md "Money".
"""

from __future__ import annotations

import math
from typing import Any

from policy.model import Policy

__all__ = ["MICRO", "cost_usd", "micro_usd", "worst_case_micro_usd"]

MICRO = 1_000_000


def _price(policy: Policy, model: str | None) -> Any:
    prices = getattr(policy, "prices", None) or {}
    return prices.get(model) if model is not None else None


def cost_usd(
    policy: Policy, model: str | None, prompt: int, completion: int, cached: int = 0
) -> float:
    """USD of one request's reported usage; 0 for a model without a price. Cached prompt tokens
    are billed at the ``cached`` price (the prompt price when unset), the rest at ``prompt``."""
    p = _price(policy, model)
    if p is None:
        return 0.0
    cached = max(0, min(cached, prompt))
    cached_price = p.prompt if p.cached is None else p.cached
    return ((prompt - cached) * p.prompt + cached * cached_price + completion * p.completion) / 1000


def micro_usd(
    policy: Policy, model: str | None, prompt: int, completion: int, cached: int = 0
) -> int:
    """:func:`cost_usd` in whole micro-USD, rounded up (a budget never undercounts)."""
    return math.ceil(cost_usd(policy, model, prompt, completion, cached) * MICRO - 1e-6)


def worst_case_micro_usd(policy: Policy, model: str | None, tokens: int) -> int:
    """Every token at the dearest of the prompt and completion prices: the reservation, when
    only a token total is known (the reserve's ``hits_addend``, or a settle without usage)."""
    p = _price(policy, model)
    if p is None or tokens <= 0:
        return 0
    return math.ceil(tokens * max(p.prompt, p.completion) * 1000 - 1e-6)
