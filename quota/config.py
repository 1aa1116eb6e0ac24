"""Quota configuration: policy defaults flattened into Redis hash fields, live fields parsed back,
and the list of limits one request is checked against. Pure functions, no I/O.

A subject's quota fields are ``<quota>.<attribute>`` strings, for example ``tokens.burst``,
``tokens.per_month``, ``requests.refill_per_second``, ``models.llama-3.1-8b.per_day``,
``lanes.batch.shadow``, ``usd.per_month`` (money, in USD). The same names are used in Redis (``tw:{tenant}:quota``), by
``tokenweir quota`` and in docs/quotas.md.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

from policy.model import Policy, Quotas
from quota.cost import MICRO
from quota.errors import QuotaConfigError
from quota.windows import UNITS

__all__ = [
    "ATTRIBUTES",
    "Limit",
    "QuotaSpec",
    "SubjectQuotas",
    "all_limits",
    "effective_quotas",
    "format_value",
    "limits_for_service",
    "limits_for_tenant",
    "parse_quota_fields",
    "service_defaults",
    "tenant_defaults",
]

log = logging.getLogger(__name__)

ATTRIBUTES: tuple[str, ...] = (
    "burst",
    "refill_per_second",
    "per_minute",
    "per_hour",
    "per_day",
    "per_month",
    "shadow",
)
_INT_ATTRS = frozenset({"burst", "per_minute", "per_hour", "per_day", "per_month"})
_MONEY_ATTRS = frozenset({"per_minute", "per_hour", "per_day", "per_month", "shadow"})
_OFF = frozenset({"", "none", "off", "null", "-"})
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
MAX_LIMIT = 10**15
Parsed: TypeAlias = bool | int | float | None  # one live quota field's value, parsed


@dataclass(frozen=True, slots=True)
class QuotaSpec:
    """One quota: a token bucket (active when burst and refill_per_second are both set) and
    calendar-window budgets. ``shadow`` decides and reports but never denies."""

    burst: int | None = None
    refill_per_second: float | None = None
    per_minute: int | None = None
    per_hour: int | None = None
    per_day: int | None = None
    per_month: int | None = None
    shadow: bool = False


@dataclass(frozen=True, slots=True)
class Limit:
    """One counter a request is checked against. ``unit`` is ``bucket`` or a window unit;
    ``tokens`` limits are charged the reservation and settled, the others count requests;
    ``money`` limits (quota ``usd``, in micro-USD) are charged the reservation's price."""

    quota: str
    unit: str
    limit: int
    rate: float
    shadow: bool
    tokens: bool
    money: bool = False


@dataclass(frozen=True)
class SubjectQuotas:
    """Effective quotas of a tenant or service: ``known`` is False for a subject that neither the
    policy nor Redis knows."""

    known: bool
    quotas: Mapping[str, QuotaSpec] = field(default_factory=dict)
    problems: tuple[str, ...] = ()


def format_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


def _flatten(prefix: str, q: object, out: dict[str, str]) -> None:
    if q is None:
        return
    for attr in ATTRIBUTES:
        value = getattr(q, attr, None)
        if value is not None and not (attr == "shadow" and value is False):
            out[f"{prefix}.{attr}"] = format_value(value)


def _quota_fields(tier_q: Quotas, own: Quotas | None) -> dict[str, str]:
    out: dict[str, str] = {}
    _flatten("tokens", own.tokens if own and own.tokens else tier_q.tokens, out)
    _flatten("requests", own.requests if own and own.requests else tier_q.requests, out)
    _flatten("usd", own.usd if own and own.usd else tier_q.usd, out)
    models = {**tier_q.models, **(own.models if own else {})}
    lanes = {**tier_q.lanes, **(own.lanes if own else {})}
    for name, q in sorted(models.items()):
        _flatten(f"models.{name}", q, out)
    for name, q in sorted(lanes.items()):
        _flatten(f"lanes.{name}", q, out)
    return out


def tenant_defaults(policy: Policy, tenant: str) -> dict[str, str] | None:
    """The policy's quota fields of a tenant (tenant quotas override its tier's per quota);
    None when the policy does not know the tenant."""
    t = policy.tenants.get(tenant)
    if t is None:
        return None
    tier = policy.tiers.get(t.tier)
    return _quota_fields(tier.quotas if tier else Quotas(), t.quotas)


def service_defaults(policy: Policy, service: str) -> dict[str, str] | None:
    s = policy.services.get(service)
    if s is None:
        return None
    out: dict[str, str] = {}
    _flatten("requests", s.rate_limit, out)
    return out


def _parse_value(attr: str, text: str, money: bool = False) -> Parsed:
    t = text.strip().lower()
    if t in _OFF and attr != "shadow":
        return None
    if attr == "shadow":
        if t in _TRUE:
            return True
        if t in _FALSE or t in _OFF:
            return False
        raise QuotaConfigError(f"expected true or false, got {text!r}")
    try:
        number = float(t)
    except ValueError:
        raise QuotaConfigError(f"expected a number or 'none', got {text!r}") from None
    if money:
        if not math.isfinite(number) or number < 0 or number > 1e9:
            raise QuotaConfigError(f"expected USD in 0..1e9 or 'none', got {text!r}")
        return round(number * MICRO)  # budgets are kept in micro-USD
    if not math.isfinite(number) or number < 0 or number > MAX_LIMIT:
        raise QuotaConfigError(f"expected a number in 0..{MAX_LIMIT}, got {text!r}")
    if attr in _INT_ATTRS:
        return int(number)
    return number


def _spec(attrs: Mapping[str, Parsed]) -> QuotaSpec:
    """The spec of one quota's parsed fields (each already in its attribute's range)."""

    def whole(attr: str) -> int | None:
        value = attrs.get(attr)
        return None if value is None else int(value)

    rate = attrs.get("refill_per_second")
    return QuotaSpec(
        burst=whole("burst"),
        refill_per_second=None if rate is None else float(rate),
        per_minute=whole("per_minute"),
        per_hour=whole("per_hour"),
        per_day=whole("per_day"),
        per_month=whole("per_month"),
        shadow=bool(attrs.get("shadow", False)),
    )


def _split(name: str) -> tuple[str, str] | None:
    quota, _, attr = name.rpartition(".")
    if attr not in ATTRIBUTES or not quota:
        return None
    head = quota.split(".", 1)[0]
    if quota in ("tokens", "requests", "usd") or (head in ("models", "lanes") and "." in quota):
        return quota, attr
    return None


def parse_quota_fields(fields: Mapping[str, str]) -> tuple[dict[str, QuotaSpec], list[str]]:
    """Quota specs from hash fields; unusable fields are reported in the second result."""
    values: dict[str, dict[str, Parsed]] = {}
    problems: list[str] = []
    for name, text in fields.items():
        parts = _split(name)
        if parts is None:
            problems.append(f"{name}: unknown quota field")
            continue
        money = parts[0] == "usd"
        if money and parts[1] not in _MONEY_ATTRS:
            problems.append(
                f"{name}: a usd budget has per_minute, per_hour, per_day, per_month (USD) and shadow"
            )
            continue
        try:
            values.setdefault(parts[0], {})[parts[1]] = _parse_value(parts[1], text, money)
        except QuotaConfigError as exc:
            problems.append(f"{name}: {exc}")
    return {q: _spec(attrs) for q, attrs in values.items()}, problems


def effective_quotas(defaults: Mapping[str, str] | None, live: Mapping[str, str]) -> SubjectQuotas:
    """Policy defaults overlaid by live fields (live wins; ``none`` removes a default)."""
    if defaults is None and not live:
        return SubjectQuotas(known=False)
    merged = {**(defaults or {}), **live}
    specs, problems = parse_quota_fields(merged)
    return SubjectQuotas(known=True, quotas=specs, problems=tuple(problems))


def _limits(
    quota: str, spec: QuotaSpec, tokens: bool, out: list[Limit], money: bool = False
) -> None:
    if spec.burst is not None and spec.refill_per_second is not None:
        out.append(
            Limit(quota, "bucket", spec.burst, float(spec.refill_per_second), spec.shadow, tokens)
        )
    for unit in UNITS:
        value = getattr(spec, f"per_{unit}")
        if value is not None:
            out.append(Limit(quota, unit, value, 0.0, spec.shadow, tokens, money))


def limits_for_tenant(sq: SubjectQuotas, model: str | None, lane: str | None) -> list[Limit]:
    """Every limit a request of this tenant for ``model`` in ``lane`` is checked against."""
    out: list[Limit] = []
    q = sq.quotas
    if "tokens" in q:
        _limits("tokens", q["tokens"], True, out)
    if model is not None and f"models.{model}" in q:
        _limits(f"models.{model}", q[f"models.{model}"], True, out)
    if lane is not None and f"lanes.{lane}" in q:
        _limits(f"lanes.{lane}", q[f"lanes.{lane}"], True, out)
    if "requests" in q:
        _limits("requests", q["requests"], False, out)
    if "usd" in q:
        _limits("usd", q["usd"], True, out, money=True)
    return out


def limits_for_service(sq: SubjectQuotas) -> list[Limit]:
    out: list[Limit] = []
    if "requests" in sq.quotas:
        _limits("requests", sq.quotas["requests"], False, out)
    return out


def all_limits(sq: SubjectQuotas) -> list[Limit]:
    """Every limit of a subject, whatever model or lane a request names (for reports)."""
    out: list[Limit] = []
    for quota, spec in sorted(sq.quotas.items()):
        _limits(quota, spec, quota != "requests", out, money=quota == "usd")
    return out
