"""The dashboard's batch panel from the runners' real metric pages (RunnerMetrics rendered by
prometheus_client): jobs, lines by outcome, lines/s, lag; sources from the policy (issue 41)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from batch_service.runner import RunnerMetrics
from controlplane.dashboard.batch import batch_panel, batch_sources
from controlplane.dashboard.summary import point_between, totals_of
from policy import load_policy

POLICY = load_policy(Path(__file__).resolve().parents[3] / "examples" / "mesh.yaml")


def page(completed: int, failed: int, lag: float, inflight: int, queued: int) -> str:
    registry = CollectorRegistry()
    m = RunnerMetrics(registry)
    m.lines.labels("completed").inc(completed)
    m.lines.labels("failed").inc(failed)
    m.lines.labels("shed").inc(7)
    m.lag.set(lag)
    m.inflight.set(inflight)
    m.window.set(inflight + 2)
    m.remaining.set(100 - completed)
    m.queued.set(queued)
    return generate_latest(registry).decode()


def test_the_runners_pages_sum_into_the_panel() -> None:
    old = totals_of([page(10, 1, 30.0, 4, 3), page(0, 0, 0.0, 0, 3)])
    new = totals_of([page(40, 3, 32.0, 6, 3), page(0, 0, 0.0, 0, 3)])
    point = point_between(old, 100.0, new, 102.0)
    assert point.batch_lines_per_s == (43 - 11) / 2
    got = batch_panel(POLICY, new, [point])
    assert got is not None
    assert got["jobs_in_flight"] == 3  # the same queue seen by both runners: not added up
    assert got["jobs_running"] == 1 and got["lag_s"] == 32.0  # the idle runner's lag is 0
    assert (got["lines_completed"], got["lines_failed"], got["lines_shed"]) == (40, 3, 14)
    assert (got["lines_in_flight"], got["window"]) == (6, 10)
    assert got["lines_remaining"] == 60 + 100
    assert got["lines_per_s"] == 16.0 and got["runners_seen"] == 2
    assert point.to_json()["batch_lines_per_s"] == 16.0


def test_no_batch_section_no_panel_no_sources() -> None:
    bare = replace(POLICY, batch=None)
    assert batch_panel(bare, totals_of([]), []) is None and batch_sources(bare) == []
    assert batch_panel(None, totals_of([]), []) is None


def test_a_source_per_runner_replica() -> None:
    assert POLICY.batch is not None
    two = replace(
        POLICY, batch=replace(POLICY.batch, runner=replace(POLICY.batch.runner, replicas=2))
    )
    port = POLICY.batch.runner.metrics_port
    got = [(s.name, s.endpoint) for s in batch_sources(two)]
    assert got == [
        ("batch runner#0", f"127.0.0.1:{port}"),
        ("batch runner#1", f"127.0.0.1:{port + 1}"),
    ]
