from __future__ import annotations

import pytest

from controlplane.planner.inputs import PlanInputs, TenantClass, TokenDist, TrafficClass
from controlplane.planner.replica import FlatReplica


def seed_inputs(**overrides: object) -> PlanInputs:
    """The seed's GPU (2,000 tok/s, 20 ms TBT) with a small, hand-checkable workload."""
    base: dict[str, object] = {
        "replica": FlatReplica(decode_tok_s=2000.0, prefill_tok_s=10_000.0),
        "prompt": TokenDist(1000, 3000),
        "output": TokenDist(500, 1200),
        "ttft_s": 1.0,
        "tbt_s": 0.020,
        "classes": (TrafficClass("chat", 8.0), TrafficClass("bulk", 2.0, "batch", 30.0)),
        "tenants": (TenantClass("pro", 4.0, 20), TenantClass("free", 1.0, 10)),
        "pool": "chat",
    }
    base.update(overrides)
    return PlanInputs(**base)  # type: ignore[arg-type]


@pytest.fixture
def seed() -> PlanInputs:
    return seed_inputs()
