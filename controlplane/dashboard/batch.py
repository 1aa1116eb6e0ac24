"""The dashboard's batch panel: the batch runners' pages (``batch.runner.metrics_port + i``)
summed into jobs in flight, lines done and failed, throughput and lag (docs/batch.md
"Metrics"; the runners' metric names are those of ``batch_service.runner.RunnerMetrics``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from controlplane.dashboard.collector import Source
from controlplane.dashboard.summary import Point, Totals
from policy.model import Policy

__all__ = ["BatchPanel", "batch_panel", "batch_sources"]


class BatchPanel(TypedDict):
    """The overview's ``batch`` (docs/api.md)."""

    runners: int
    runners_seen: int
    jobs_in_flight: int
    jobs_running: int
    lines_completed: int
    lines_failed: int
    lines_shed: int
    lines_in_flight: int
    window: int
    lines_remaining: int
    lag_s: float
    lines_per_s: float | None


def batch_sources(policy: Policy) -> list[Source]:
    """Every batch runner's ``/metrics`` (replica ``i`` on ``metrics_port + i``)."""
    b = policy.batch
    if b is None:
        return []
    r = b.runner
    return [
        Source(f"batch runner#{i}", f"127.0.0.1:{r.metrics_port + i}") for i in range(r.replicas)
    ]


def batch_panel(
    policy: Policy | None, totals: Totals, points: Sequence[Point]
) -> BatchPanel | None:
    """The panel's figures (None without a ``batch`` section): jobs queued or running, lines
    by outcome since the runners started, lines in flight and allowed, lines left of the jobs
    being run, the oldest running job's age and the answered lines per second (the latest
    chart point)."""
    if policy is None or policy.batch is None:
        return None
    lines = totals.batch_lines
    return {
        "runners": policy.batch.runner.replicas,
        "runners_seen": int(totals.batch_runners),
        "jobs_in_flight": int(totals.batch_queued),
        "jobs_running": int(totals.batch_running),
        "lines_completed": int(lines.get("completed", 0.0)),
        "lines_failed": int(lines.get("failed", 0.0)),
        "lines_shed": int(lines.get("shed", 0.0)),
        "lines_in_flight": int(totals.batch_inflight),
        "window": int(totals.batch_window),
        "lines_remaining": int(totals.batch_remaining),
        "lag_s": round(totals.batch_lag, 3),
        "lines_per_s": round(points[-1].batch_lines_per_s, 3) if points else None,
    }
