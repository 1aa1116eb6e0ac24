"""The policy fragment a plan implies, and merging it into an existing policy document.

The fragment uses the policy schema of ``policy`` (docs/policy.md)::

    pools.<pool>.circuit_breakers.{interactive,batch}: max_connections, max_pending_requests,
                                                       max_requests, max_retries
    pools.<pool>.emulated: {replicas, profile}          (when the plan used a named profile)
    tiers.<tier>.quotas.tokens:   {burst, refill_per_second}
    tiers.<tier>.quotas.requests: {burst, refill_per_second}

Merging is a deep merge: the plan's keys replace the policy's, every other key is kept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import yaml

from .plan import Plan

__all__ = ["EMULATED_MAX_REPLICAS", "fragment", "fragment_yaml", "merge"]

EMULATED_MAX_REPLICAS = 64  # the policy's limit on emulated replicas


def fragment(plan: Plan) -> dict[str, object]:
    """The policy keys this plan sets, as plain data (ready for ``yaml.safe_dump``)."""
    inputs = plan.inputs
    pool: dict[str, object] = {
        "circuit_breakers": {
            b.lane: {
                "max_connections": b.max_connections,
                "max_pending_requests": b.max_pending_requests,
                "max_requests": b.max_requests,
                "max_retries": b.max_retries,
            }
            for b in plan.breakers
        }
    }
    if inputs.models:
        pool["models"] = list(inputs.models)
    if inputs.profile_name is not None and plan.replicas <= EMULATED_MAX_REPLICAS:
        pool["emulated"] = {"replicas": plan.replicas, "profile": inputs.profile_name}
    tiers = {
        b.tier: {
            "quotas": {
                "tokens": {
                    "burst": b.token_burst,
                    "refill_per_second": _round_up(b.token_refill_per_s),
                },
                "requests": {
                    "burst": b.request_burst,
                    "refill_per_second": _round_up(b.request_refill_per_s),
                },
            }
        }
        for b in plan.buckets
    }
    out: dict[str, object] = {"version": 1, "pools": {inputs.pool: pool}}
    if tiers:
        out["tiers"] = tiers
    return out


def _round_up(x: float) -> float:
    """Three decimals, never below the computed rate (a contract must not be undersold)."""
    return math.ceil(x * 1000 - 1e-9) / 1000


def merge(base: Mapping[str, object], overlay: Mapping[str, object]) -> dict[str, object]:
    """Deep merge: mappings merge key by key, anything else in ``overlay`` replaces ``base``."""
    out = dict(base)
    for key, value in overlay.items():
        old = out.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            out[key] = merge(old, value)
        else:
            out[key] = value
    return out


def fragment_yaml(plan: Plan) -> str:
    """The fragment as YAML with a header naming what produced it."""
    inputs = plan.inputs
    header = (
        f"# tokenweir plan: {plan.replicas} replicas of {inputs.profile_name or 'a flat replica'}"
        f" for {inputs.total_qps:g} req/s at utilization {plan.utilization:.3g}\n"
        "# merge into the policy (tokenweir plan --merge-into POLICY) and run tokenweir validate\n"
    )
    return header + yaml.safe_dump(fragment(plan), sort_keys=False)
