"""The emulator's LoRA metrics (its own names under ``sglang:``; SGLang exports none we could
confirm from its source). Read from the registry and the slots at scrape time.

- ``sglang:lora_registered_adapters``: adapters a request may name (``--max-loaded-loras``)
- ``sglang:lora_resident{lora_name}``: 1 per adapter now in a GPU slot
- ``sglang:lora_slot_loads_total``: adapters brought into a slot (each costs ``--lora-load-ms``)
- ``sglang:lora_evictions_total``: adapters unregistered by ``--max-loaded-loras``
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backends.emulator.lora import LoraRegistry, LoraSlots

__all__ = ["register_lora_metrics"]


class _LoraCollector(Collector):
    def __init__(self, model: str, registry: LoraRegistry, slots: LoraSlots) -> None:
        self._model, self._registry, self._slots = model, registry, slots

    def collect(self) -> Iterator[Metric]:
        m = self._model
        g = GaugeMetricFamily(
            "sglang:lora_registered_adapters", "LoRA adapters loaded", labels=["model_name"]
        )
        g.add_metric([m], float(len(self._registry.names())))
        yield g
        r = GaugeMetricFamily(
            "sglang:lora_resident",
            "1 for each LoRA adapter in a GPU slot (--max-loras-per-batch)",
            labels=["model_name", "lora_name"],
        )
        for name in self._slots.resident():
            r.add_metric([m, name], 1.0)
        yield r
        c = CounterMetricFamily(
            "sglang:lora_slot_loads", "LoRA adapters brought into a GPU slot", labels=["model_name"]
        )
        c.add_metric([m], float(self._slots.loads_total))
        yield c
        e = CounterMetricFamily(
            "sglang:lora_evictions",
            "LoRA adapters unregistered to stay within --max-loaded-loras",
            labels=["model_name"],
        )
        e.add_metric([m], float(self._registry.evictions_total))
        yield e


def register_lora_metrics(
    target: CollectorRegistry, model: str, registry: LoraRegistry, slots: LoraSlots
) -> None:
    target.register(_LoraCollector(model, registry, slots))
