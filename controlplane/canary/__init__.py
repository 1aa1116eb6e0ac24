"""Canary versions of pools: watch canary against baseline, roll the weight back to 0."""

from controlplane.canary.judge import Guard, Sample, judge, p95
from controlplane.canary.overrides import OverrideCache, apply_weights
from controlplane.canary.watcher import CANARY_PATH, CanaryWatcher

__all__ = [
    "CANARY_PATH",
    "CanaryWatcher",
    "Guard",
    "OverrideCache",
    "Sample",
    "apply_weights",
    "judge",
    "p95",
]
