"""A pool's LoRA adapters become models of the pool (policy/lora.py), before the loader's
cross-reference checks, so routes, quotas and prices take adapter names like any model."""

from __future__ import annotations

import dataclasses

from policy.model import Policy

__all__ = ["with_adapter_models"]


def with_adapter_models(policy: Policy) -> tuple[Policy, list[tuple[str, str]]]:
    """Each pool's adapters added to its models; an adapter that is also a model of the pool
    is reported as ``(key path, message)``."""
    problems: list[tuple[str, str]] = []
    pools = dict(policy.pools)
    for name, pool in policy.pools.items():
        if pool.lora is None:
            continue
        for i, adapter in enumerate(pool.lora.adapters):
            if adapter in pool.models:
                problems.append(
                    (f"pools.{name}.lora.adapters[{i}]",
                     f"{adapter!r} is already a model of the pool; an adapter needs its own name")
                )  # fmt: skip
        models = tuple(dict.fromkeys((*pool.models, *pool.lora.adapters)))
        pools[name] = dataclasses.replace(pool, models=models)
    return dataclasses.replace(policy, pools=pools), problems
