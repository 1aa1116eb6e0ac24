"""Planner inputs as frozen values, checked on construction (bad input → PlanInputError)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from .errors import PlanInputError
from .replica import ReplicaModel

__all__ = [
    "DEFAULT_UTILIZATION",
    "LANES",
    "Lane",
    "PlanInputs",
    "TenantClass",
    "TokenDist",
    "TrafficClass",
]

Lane = Literal["interactive", "batch"]
LANES: tuple[Lane, ...] = ("interactive", "batch")
DEFAULT_UTILIZATION = 0.65
_Z95 = 1.6448536269514722  # standard normal 95th percentile


def _positive(field_name: str, value: float, *, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    if not math.isfinite(value) or not ok:
        need = "≥ 0" if allow_zero else "> 0"
        raise PlanInputError(field_name, f"must be a finite number {need}, got {value}")


@dataclass(frozen=True)
class TokenDist:
    """A token-count distribution: mean, p95, and optionally its squared coeff. of variation."""

    mean: float
    p95: float
    scv: float | None = None
    field_name: str = "tokens"

    def __post_init__(self) -> None:
        _positive(f"{self.field_name}.mean", self.mean, allow_zero=True)
        _positive(f"{self.field_name}.p95", self.p95, allow_zero=True)
        if self.p95 < self.mean:
            raise PlanInputError(
                f"{self.field_name}.p95",
                f"p95 ({self.p95:g}) is below the mean ({self.mean:g}) by {self.mean - self.p95:g}",
            )
        if self.scv is not None:
            _positive(f"{self.field_name}.scv", self.scv, allow_zero=True)

    @classmethod
    def from_samples(cls, values: Sequence[float], field_name: str = "tokens") -> TokenDist:
        """Mean, nearest-rank p95 and SCV (variance / mean²) of a sample."""
        if not values:
            raise PlanInputError(field_name, "the sample is empty")
        xs = sorted(float(v) for v in values)
        n = len(xs)
        mean = sum(xs) / n
        p95 = xs[max(0, math.ceil(0.95 * n) - 1)]
        var = sum((x - mean) ** 2 for x in xs) / n
        scv = var / (mean * mean) if mean > 0 else 0.0
        return cls(mean, max(p95, mean), scv, field_name)

    def scv_estimate(self) -> float:
        """SCV given, else from a lognormal with this mean and p95.

        ln(p95/mean) = z·σ − σ²/2 (z = 1.645) → σ = z − √(z² − 2·ln(p95/mean)); SCV = e^{σ²} − 1.
        A p95 so far above the mean that no lognormal fits gets the largest fitting σ = z.
        """
        if self.scv is not None:
            return self.scv
        if self.mean <= 0 or self.p95 <= self.mean:
            return 0.0
        k = math.log(self.p95 / self.mean)
        disc = _Z95 * _Z95 - 2.0 * k
        sigma = _Z95 - math.sqrt(disc) if disc > 0 else _Z95
        return math.expm1(sigma * sigma)


@dataclass(frozen=True)
class TrafficClass:
    """Target QPS of one traffic class, its lane, and optionally its own TTFT budget."""

    name: str
    qps: float
    lane: Lane = "interactive"
    ttft_s: float | None = None

    def __post_init__(self) -> None:
        _positive(f"classes.{self.name}.qps", self.qps, allow_zero=True)
        if self.lane not in LANES:
            raise PlanInputError(
                f"classes.{self.name}.lane", f"unknown lane {self.lane!r}; allowed: {list(LANES)}"
            )
        if self.ttft_s is not None:
            _positive(f"classes.{self.name}.ttft", self.ttft_s)


@dataclass(frozen=True)
class TenantClass:
    """A tenant class (a policy tier): contracted average QPS and the burst it may send at once."""

    name: str
    avg_qps: float
    burst_requests: int

    def __post_init__(self) -> None:
        _positive(f"tenants.{self.name}.avg_qps", self.avg_qps)
        if self.burst_requests < 1:
            raise PlanInputError(
                f"tenants.{self.name}.burst", f"must be ≥ 1 request, got {self.burst_requests}"
            )


@dataclass(frozen=True)
class PlanInputs:
    """Everything one plan needs. Times in seconds, rates per second."""

    replica: ReplicaModel
    prompt: TokenDist
    output: TokenDist
    ttft_s: float
    tbt_s: float
    classes: tuple[TrafficClass, ...]
    tenants: tuple[TenantClass, ...] = ()
    target_utilization: float = DEFAULT_UTILIZATION
    prefix_hit_rate: float = 0.0
    max_replicas: int | None = None
    quantile: float = 0.95
    pool: str = "default"
    profile_name: str | None = None
    models: tuple[str, ...] = field(default=())
    context_note: str = ""  # how a profile's context terms were folded in (replica.for_workload)

    def __post_init__(self) -> None:
        _positive("budgets.ttft", self.ttft_s)
        _positive("budgets.tbt", self.tbt_s)
        u = self.target_utilization
        if not (math.isfinite(u) and 0 < u < 1):
            why = (
                f" ({u:g} is over 1 by {u - 1:.3g}: arrivals at or above capacity, the queue grows"
                " without bound)"
                if u >= 1
                else ""
            )
            raise PlanInputError("target_utilization", f"must be in (0, 1), got {u:g}{why}")
        h = self.prefix_hit_rate
        if not (math.isfinite(h) and 0 <= h < 1):
            raise PlanInputError("prefix_cache_hit_rate", f"must be in [0, 1), got {h:g}")
        if not 0 < self.quantile < 1:
            raise PlanInputError("quantile", f"must be in (0, 1), got {self.quantile:g}")
        if not self.classes:
            raise PlanInputError("classes", "give at least one traffic class with its QPS")
        if sum(c.qps for c in self.classes) <= 0:
            raise PlanInputError("classes", "the total QPS is 0; nothing to plan for")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise PlanInputError("classes", f"duplicate class names in {names}")
        if self.max_replicas is not None and self.max_replicas < 1:
            raise PlanInputError("max_replicas", f"must be ≥ 1, got {self.max_replicas}")

    @property
    def total_qps(self) -> float:
        return sum(c.qps for c in self.classes)

    def lane_qps(self, lane: Lane) -> float:
        return sum(c.qps for c in self.classes if c.lane == lane)

    def lane_ttft_s(self, lane: Lane) -> float:
        """The tightest TTFT budget among the lane's classes (the global budget by default)."""
        budgets = [c.ttft_s or self.ttft_s for c in self.classes if c.lane == lane]
        return min(budgets) if budgets else self.ttft_s
