"""Fairness in tokens through the whole mesh (`tokenweir up --replicas filters=2`, one emulated
replica, a capacity of 4): a tenant weighing 3 that asks for short answers and one weighing 1
that asks for answers four times longer, both keeping the lane's queue full, are served their
settled tokens about 3:1 (1.8 to 4.5 here: a 20 s run on a shared box) — with request-count fairness the long answers' tenant got more tokens than
the other (about 1.2:1). Both filter servers count what the other served (Redis), and export the
lane's Jain index. ``bench/fairness.py`` runs the same for longer, beside main's code."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import fairness

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(240)]


def test_tenants_share_a_saturated_lane_by_weight_in_settled_tokens(tmp_path: Path) -> None:
    row = fairness.run_scenario(
        "weighted", tmp_path, src=None, seconds=20, warmup=5, clients=16, long=200, short=50
    )
    ratio = row["heavy_over_light"]
    # 20 s on a shared 2-core box: 2.1-3.1 measured (the bench's 60 s runs: 2.56-2.71, docs/
    # benchmarks.md); request-count fairness gives 0.69-0.86, the long answers' tenant ahead
    assert isinstance(ratio, float) and 1.8 <= ratio <= 4.5, row
    gauges = row["jain_gauges"]
    assert isinstance(gauges, list) and all(g is not None and g > 0.8 for g in gauges), row
