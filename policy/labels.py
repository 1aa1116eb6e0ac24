"""Bounded metric label values: only names the policy knows become label values.

A tenant, model or cost center that the policy does not name (a live-only tenant, a typo in a
request, an attacker's garbage) is folded into ``other``, so a metric has at most
``len(policy names) + 1`` values per label however many distinct strings arrive
(docs/metrics.md, "Label cardinality"; tests/policy/test_labels.py).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Set
from dataclasses import dataclass

from policy.common import LANES
from policy.model import Policy

__all__ = ["OTHER", "LabelFold", "PolicyLabels"]

OTHER = "other"


class LabelFold:
    """``fold(value)``: the value when known, else ``other`` (``None`` and "" fold too).

    A mapping or set is kept as it is, not copied: the tenant fold answers from the policy's
    own (frozen) ``tenants`` dict, so configuring the metrics on a reload costs O(1) on the
    event loop however many tenants there are (a copy of 10,000 names there was a stall)."""

    __slots__ = ("known",)

    def __init__(self, known: Iterable[str] = ()) -> None:
        self.known: Collection[str] = (
            known if isinstance(known, (Mapping, Set)) else frozenset(known)  # type: ignore[assignment]  # a Mapping or Set of str serves as the Collection[str] that 'in' needs
        )

    def __call__(self, value: str | None) -> str:
        return value if value in self.known else OTHER  # type: ignore[return-value]  # value is a str here: None is never in known


@dataclass(frozen=True)
class PolicyLabels:
    """The label folds of one policy: tenants, models, lanes, cost centers, quota names."""

    tenant: LabelFold
    model: LabelFold
    lane: LabelFold

    @classmethod
    def of(cls, policy: Policy) -> PolicyLabels:
        """O(pools) on the event loop: nothing here walks the tenants (see :class:`LabelFold`)."""
        models = {m for pool in policy.pools.values() for m in pool.models}
        return cls(
            tenant=LabelFold(policy.tenants),
            model=LabelFold(models),
            lane=LabelFold(LANES),
        )

    @classmethod
    def empty(cls) -> PolicyLabels:
        return cls(LabelFold(), LabelFold(), LabelFold(LANES))

    @staticmethod
    def cost_center_of(policy: Policy | None, tenant: str | None) -> str:
        """The policy tenant's own cost center (a name the policy holds), else ``other`` (and
        ``other`` before a policy is known)."""
        t = policy.tenants.get(tenant) if tenant and policy is not None else None
        return (t.cost_center if t is not None else None) or OTHER

    def quota(self, name: str) -> str:
        """A quota name with its model or lane folded (``models.<m>``, ``lanes.<l>``)."""
        head, _, rest = name.partition(".")
        if head == "models":
            return f"models.{self.model(rest)}"
        if head == "lanes":
            return f"lanes.{self.lane(rest)}"
        return name if head in ("tokens", "requests", "usd") else OTHER
