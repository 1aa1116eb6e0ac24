"""Tiers, tenants and their quotas (enforced by the rate-limit service, docs/quotas.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from policy.common import LANES, Lane, Positive
from policy.decode import Range

__all__ = ["MoneyLimits", "Price", "QuotaLimits", "Quotas", "Tenant", "Tier"]

_USD = Annotated[float, Range(0.000001, 1e9)]  # a budget in USD (at least one micro-dollar)
_PRICE = Annotated[float, Range(0, 1e6)]  # USD per 1,000 tokens


@dataclass(frozen=True)
class QuotaLimits:
    """A token bucket (burst = C, refill_per_second = r) and long-window budgets."""

    burst: Positive | None = None
    refill_per_second: Annotated[float, Range(0, 1e9)] | None = None
    per_minute: Positive | None = None
    per_hour: Positive | None = None
    per_day: Positive | None = None
    per_month: Positive | None = None
    shadow: bool = False

    def __post_init__(self) -> None:
        if (self.burst is None) != (self.refill_per_second is None):
            raise ValueError("a token bucket needs both burst and refill_per_second")


@dataclass(frozen=True)
class MoneyLimits:
    """A money budget: USD per calendar window (UTC), reserved and settled like token windows
    (docs/quotas.md "Money"). ``shadow`` decides and reports but never denies."""

    per_minute: _USD | None = None
    per_hour: _USD | None = None
    per_day: _USD | None = None
    per_month: _USD | None = None
    shadow: bool = False


@dataclass(frozen=True)
class Price:
    """USD per 1,000 tokens of one model: prompt, cached prompt (default: the prompt price) and
    completion tokens."""

    prompt: _PRICE
    completion: _PRICE
    cached: _PRICE | None = None


@dataclass(frozen=True)
class Quotas:
    tokens: QuotaLimits | None = None
    requests: QuotaLimits | None = None
    models: dict[str, QuotaLimits] = field(default_factory=dict)
    lanes: dict[str, QuotaLimits] = field(default_factory=dict)
    usd: MoneyLimits | None = None

    def __post_init__(self) -> None:
        bad = [k for k in self.lanes if k not in LANES]
        if bad:
            raise ValueError(f"lanes: unknown lane(s) {bad}; allowed: {list(LANES)}")


@dataclass(frozen=True)
class Tier:
    lane: Lane = "interactive"
    allowed_lanes: tuple[Lane, ...] = ("interactive", "batch")
    max_tokens: Positive = 4096
    quotas: Quotas = field(default_factory=Quotas)


@dataclass(frozen=True)
class Tenant:
    tier: str
    api_keys: tuple[str, ...] = ()
    quotas: Quotas | None = None
    cost_center: str | None = None  # groups tenants in cost metrics (docs/metrics.md)
