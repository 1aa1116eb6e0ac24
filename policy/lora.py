"""Policy of a pool's LoRA adapters (docs/policy.md "LoRA adapters").

``pools.NAME.lora`` names the adapters the pool's replicas serve on their base model. Each
adapter is a model of the pool: clients name it in ``model``; routes, quotas
(``tiers.T.quotas.models.ADAPTER``) and prices (``prices.ADAPTER``) take it like any model. The
loader adds the names to the pool's ``models`` before its cross-reference checks
(``policy.lora_models``). The filter server tells the replica which adapter to run (SGLang's
``lora_path`` in the body) and the picker prefers replicas that hold the adapter
(filters/plugins/picker/lora.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from policy.decode import Duration, Range

__all__ = ["LoraAdapters"]


@dataclass(frozen=True)
class LoraAdapters:
    """``pools.NAME.lora``."""

    adapters: tuple[str, ...]
    # SGLang's --max-loras-per-batch of the replicas: adapters one replica holds at once
    slots: Annotated[int, Range(1, 1024)] = 8
    # a replica holding the adapter keeps it while its in-flight count is within this factor
    # of the pool's mean (percent, as affinity.hash_balance_factor); past it the adapter spreads
    spread_factor: Annotated[int, Range(100, 10000)] = 150
    # where a replica reads an adapter that the gateway asks it to load (/load_lora_adapter's
    # lora_path); an adapter not listed loads from its name (SGLang's `--lora-paths path` form)
    paths: dict[str, str] = field(default_factory=dict)
    # how often the gateway reads the replicas' adapters (/get_server_info); 0: never
    refresh: Annotated[float, Duration(0, 3600)] = 2.0
    # a holder this share of its bound busy makes the gateway load the adapter on the replica
    # the adapter would spread to, ahead of demand (percent; 0: never)
    preload_at: Annotated[int, Range(0, 100)] = 75

    def __post_init__(self) -> None:
        if not self.adapters:
            raise ValueError("adapters: list at least one adapter name")
        if len(set(self.adapters)) != len(self.adapters):
            raise ValueError("adapters: an adapter is listed twice")
        for name in self.paths:
            if name not in self.adapters:
                raise ValueError(f"paths: {name!r} is not one of the adapters")
        for name in self.adapters:
            if not name or ":" in name or name.strip() != name:
                raise ValueError(
                    f"adapters: {name!r} is not a valid adapter name (no ':', no blanks: "
                    "clients may write it 'base:adapter')"
                )
