"""Policy of priority admission at the gateway (filters/plugins/admission, docs/policy.md).

Each lane has a bounded queue in every filter process; requests wait there (holding Envoy's
request headers) until the pool has room, strict priority between lanes, weighted fairness
between tenants inside a lane. A lane's longest wait comes from its TTFT budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from policy.common import Positive
from policy.decode import Duration, Range

__all__ = ["DEFAULT_PRIORITY", "HOLD_SLACK", "AdmissionPolicy", "LaneAdmission", "hold_slack"]

# Seconds a held request's answer may come after its queue wait ends: the shed answer of a
# request whose wait ran out is written then, and a busy filter server (its event loop behind
# by hundreds of milliseconds on a loaded machine) must still beat Envoy's timer, or the
# client gets Envoy's own 504 without Retry-After instead of the 503 with one.
HOLD_SLACK = 2.0


def hold_slack(message_timeout: float) -> float:
    """How long past a queued request's longest wait Envoy keeps waiting for its answer (the
    filter server asks for wait + this with ``override_message_timeout``; the control plane
    allows it with ``max_message_timeout``)."""
    return max(message_timeout, HOLD_SLACK)


Weight = Annotated[int, Range(1, 1000)]
DEFAULT_PRIORITY = {"interactive": 100, "batch": 0}


@dataclass(frozen=True)
class LaneAdmission:
    """One lane's queue: its bound, its longest wait and the share of the pool it may hold.

    ``max_wait`` defaults to half of ``ttft_budget`` (the rest is left for the prefill);
    ``max_queue_per_tenant`` defaults to half of ``max_queue`` (one tenant cannot fill a lane);
    ``max_share`` is the fraction of the pool's running slots this lane may hold at once;
    ``leave_for_higher`` (a headroom fraction, or None for off) makes the lane leave free the
    slots the lanes above it are measured to need (offered rate × hold time × (1 + headroom)):
    a lower lane's stream cannot be preempted once started (unless the pool preempts:
    ``pools.NAME.priority_scheduling``), so without it a burst of batch can make interactive
    wait for whole batch streams. It has no effect on the highest lane. ``priority`` is the
    request priority (SGLang's ``priority`` field) the lane's requests carry to a pool that
    schedules by priority; default 100 for interactive, 0 for batch (apart by more than
    SGLang's default preemption threshold, 10). Larger ranks higher.
    """

    ttft_budget: Annotated[float, Duration(0.001, 3600)] = 1.0
    max_wait: Annotated[float, Duration(0, 3600)] | None = None
    max_queue: Annotated[int, Range(0, 1_000_000)] = 256
    max_queue_per_tenant: Positive | None = None
    max_share: Annotated[float, Range(0.01, 1.0)] = 1.0
    leave_for_higher: Annotated[float, Range(0.0, 10.0)] | None = 0.25
    priority: Annotated[int, Range(-1_000_000, 1_000_000)] | None = None

    def __post_init__(self) -> None:
        if self.max_wait is not None and self.max_wait > self.ttft_budget:
            raise ValueError("max_wait must not exceed ttft_budget (the wait is part of the TTFT)")
        if self.max_queue_per_tenant is not None and self.max_queue_per_tenant > self.max_queue:
            raise ValueError("max_queue_per_tenant must not exceed max_queue")

    @property
    def wait(self) -> float:
        """The longest time a request may wait in this lane's queue."""
        return self.max_wait if self.max_wait is not None else self.ttft_budget / 2

    @property
    def tenant_queue(self) -> int:
        """How many requests one tenant may have queued in this lane."""
        if self.max_queue_per_tenant is not None:
            return self.max_queue_per_tenant
        return max(1, self.max_queue // 2) if self.max_queue else 0


@dataclass(frozen=True)
class AdmissionPolicy:
    """``gateways``: how many gateway replicas (each with ``filters.processes`` filter
    processes) admit to the same pools; each process admits ``capacity / (gateways ×
    processes)`` (the split rule, docs/operations.md). ``tier_weights``: a tier's share of its
    lane against other tiers' tenants (default ``default_weight``). ``pool_state``: read the
    control plane's published saturation and admit fewer while a pool is saturated."""

    enabled: bool = True
    gateways: Annotated[int, Range(1, 64)] = 1
    interactive: LaneAdmission = field(
        default_factory=lambda: LaneAdmission(ttft_budget=1.0, max_queue=256)
    )
    batch: LaneAdmission = field(
        default_factory=lambda: LaneAdmission(ttft_budget=30.0, max_queue=1024, max_share=0.9)
    )
    tier_weights: dict[str, Weight] = field(default_factory=dict)
    default_weight: Weight = 1
    pool_state: bool = True

    def lane(self, name: str) -> LaneAdmission:
        return self.batch if name == "batch" else self.interactive

    def priority(self, lane: str) -> int:
        """The request priority ``lane`` carries to a pool that schedules by priority."""
        given = self.lane(lane).priority
        if given is not None:
            return given
        return DEFAULT_PRIORITY["batch" if lane == "batch" else "interactive"]

    def __post_init__(self) -> None:
        if self.priority("interactive") <= self.priority("batch"):
            raise ValueError(
                "interactive.priority must be larger than batch.priority (larger ranks higher)"
            )

    def weight(self, tier: str | None) -> int:
        return self.tier_weights.get(tier, self.default_weight) if tier else self.default_weight
