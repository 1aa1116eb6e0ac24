"""Policy of a pool's canary version and its automatic rollback (controlplane/canary,
docs/policy.md "Canary").

A canary is another set of replicas for the same models. ``weight`` percent of the pool's
traffic goes to it, chosen by the pool's affinity hash (the session header first), so one
conversation stays on one version. A tenant listed in ``force_tenants`` may pick the version
with the ``force_header`` (``canary`` or ``baseline``); anyone else's header is ignored. The
control plane compares the canary with the baseline over ``rollback.window`` and sets the weight
to 0 when a threshold stays breached for ``rollback.sustain``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from policy.common import Address, Positive
from policy.decode import Duration, Range

__all__ = ["CanaryPolicy", "CanaryRollback"]


@dataclass(frozen=True)
class CanaryRollback:
    """When the canary is rolled back: over the trailing ``window``, its 5xx rate above
    ``max_error_rate`` (absolute, 0..1), or its TTFT p95 / TBT p95 above ``max_ttft_ratio`` /
    ``max_tbt_ratio`` times the baseline's (each at least ``latency_floor``), once the canary
    has ``min_requests`` in the window; the breach must last ``sustain`` (0: at once)."""

    enabled: bool = True
    interval: Annotated[float, Duration(0.05, 60)] = 1.0
    window: Annotated[float, Duration(0.5, 3600)] = 10.0
    sustain: Annotated[float, Duration(0, 3600)] = 0.0
    min_requests: Positive = 5
    max_error_rate: Annotated[float, Range(0.0, 1.0)] = 0.05
    max_ttft_ratio: Annotated[float, Range(1.0, 1000.0)] = 2.0
    max_tbt_ratio: Annotated[float, Range(1.0, 1000.0)] = 2.0
    latency_floor: Annotated[float, Duration(0, 60)] = 0.05


@dataclass(frozen=True)
class CanaryPolicy:
    endpoints: tuple[Address, ...]
    weight: Annotated[int, Range(0, 100)] = 0
    force_header: str = "x-canary"
    force_tenants: tuple[str, ...] = ()
    rollback: CanaryRollback = field(default_factory=CanaryRollback)

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ValueError("endpoints: a canary needs at least one replica")
        if self.force_header != self.force_header.lower() or not self.force_header:
            raise ValueError("force_header: a lower-case header name is allowed")
        if self.force_header.startswith("x-tokenweir-"):
            raise ValueError("force_header: x-tokenweir-* headers are internal and stripped")
