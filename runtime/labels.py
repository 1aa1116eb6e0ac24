"""Bounded metric label values: only names the policy knows become label values.

A tenant, model or cost center that the policy does not name (a live-only tenant, a typo in a
request, an attacker's garbage) is folded into ``other``, so a metric has at most
``len(policy names) + 1`` values per label however many distinct strings arrive
(docs/metrics.md, "Label cardinality"; tests/runtime/test_labels.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from controlplane.policy.common import LANES

__all__ = ["OTHER", "LabelFold", "PolicyLabels"]

OTHER = "other"


class LabelFold:
    """``fold(value)``: the value when known, else ``other`` (``None`` and "" fold too)."""

    __slots__ = ("known",)

    def __init__(self, known: Iterable[str] = ()) -> None:
        self.known = frozenset(known)

    def __call__(self, value: str | None) -> str:
        return value if value in self.known else OTHER  # type: ignore[return-value]


@dataclass(frozen=True)
class PolicyLabels:
    """The label folds of one policy: tenants, models, lanes, cost centers, quota names."""

    tenant: LabelFold
    model: LabelFold
    lane: LabelFold
    cost_center: LabelFold

    @classmethod
    def of(cls, policy: Any) -> PolicyLabels:
        models = {m for pool in policy.pools.values() for m in pool.models}
        centers = {
            c for t in policy.tenants.values() if (c := getattr(t, "cost_center", None)) is not None
        }
        return cls(
            tenant=LabelFold(policy.tenants),
            model=LabelFold(models),
            lane=LabelFold(LANES),
            cost_center=LabelFold(centers),
        )

    @classmethod
    def empty(cls) -> PolicyLabels:
        return cls(LabelFold(), LabelFold(), LabelFold(LANES), LabelFold())

    def cost_center_of(self, policy: Any, tenant: str | None) -> str:
        t = policy.tenants.get(tenant) if tenant else None
        return self.cost_center(getattr(t, "cost_center", None)) if t is not None else OTHER

    def quota(self, name: str) -> str:
        """A quota name with its model or lane folded (``models.<m>``, ``lanes.<l>``)."""
        head, _, rest = name.partition(".")
        if head == "models":
            return f"models.{self.model(rest)}"
        if head == "lanes":
            return f"lanes.{self.lane(rest)}"
        return name if head in ("tokens", "requests", "usd") else OTHER
