"""Every metric name the code exports, read from the real registries (no process started).

Each family gives the sample names Prometheus stores: ``name_total`` for counters, the
``_bucket``/``_sum``/``_count`` series of histograms, ``name_info`` for info metrics.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

__all__ = ["exported_metric_names"]

_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count"),
    "info": ("_info",),
}


def _registries() -> list[CollectorRegistry]:
    from backends.emulator.metrics import EmulatorMetrics
    from backends.emulator.scheduler import SchedulerStats
    from batch_service.runner import RunnerMetrics
    from controlplane.app import ControlPlane, ControlPlaneSettings
    from filters.metrics import FilterMetrics
    from filters.plugins.admission.gate import AdmissionMetrics
    from filters.plugins.degrade.state import LadderMetrics
    from filters.plugins.picker.metrics import PickerMetrics
    from policy import Address
    from ratelimit_service.metrics import Metrics as RateLimitMetrics
    from runtime.watcher import ReloadMetrics

    plane = ControlPlane(
        ControlPlaneSettings(Path("mesh.yaml"), Address("127.0.0.1", 1), Address("127.0.0.1", 2))
    )
    filters = FilterMetrics(CollectorRegistry())
    AdmissionMetrics(filters.registry)
    LadderMetrics(filters.registry)
    PickerMetrics(filters.registry)
    ReloadMetrics(filters.registry)
    ratelimit = RateLimitMetrics(CollectorRegistry())
    ReloadMetrics(ratelimit.registry)
    emulator = EmulatorMetrics("m")
    emulator.bind(lambda: SchedulerStats(0, 0, 0, 1, 0.0, 0.0, 0.0, 0))  # the scrape-time gauges
    runner = CollectorRegistry()
    RunnerMetrics(runner)
    return [plane.registry, filters.registry, ratelimit.registry, emulator.registry, runner]


def exported_metric_names() -> set[str]:
    names: set[str] = set()
    for registry in _registries():
        for family in registry.collect():
            suffixes = _SUFFIXES.get(family.type, ("",))
            names.update(family.name + s for s in suffixes)
            names.update(s.name for s in family.samples)
    return names
