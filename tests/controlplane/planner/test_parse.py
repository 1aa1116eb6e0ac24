"""Planner inputs from YAML mappings and sample files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controlplane.planner.errors import PlanInputError
from controlplane.planner.parse import (
    inputs_from_mapping,
    load_samples,
    parse_duration,
    read_planner_section,
)
from controlplane.planner.replica import FlatReplica

SECTION = """
planner:
  pool: chat
  backend: {decode_tok_s: 2000, prefill_tok_s: 10000}
  prompt_tokens: {mean: 1000, p95: 3000}
  output_tokens: {mean: 500, p95: 1200}
  budgets: {ttft: 1s, tbt: 20ms}
  target_utilization: 0.7
  classes:
    chat: {qps: 8}
    bulk: {qps: 2, lane: batch, ttft: 30s}
  tenants:
    pro: {avg_qps: 4, burst: 20}
"""


def test_section_builds_inputs() -> None:
    inputs = inputs_from_mapping(read_planner_section(SECTION))
    assert isinstance(inputs.replica, FlatReplica) and inputs.replica.decode_tok_s == 2000
    assert (inputs.ttft_s, inputs.tbt_s) == (1.0, 0.02)
    assert inputs.total_qps == 10 and inputs.lane_ttft_s("batch") == 30.0
    assert inputs.target_utilization == 0.7 and inputs.tenants[0].burst_requests == 20


def test_profile_backend() -> None:
    m = read_planner_section(SECTION)
    m["backend"] = {"profile": "seed-2k"}
    inputs = inputs_from_mapping(m)
    assert inputs.profile_name == "seed-2k" and inputs.replica.max_running_requests == 64


def test_profile_with_context_terms_is_planned_at_the_workload_context() -> None:
    """The H200 profile's step times grow with context: the planner folds them in at the
    workload's means (prompt + output/2 per decoding stream) and says so in the plan."""
    from backends.profiles import get_profile
    from controlplane.planner.capacity import replica_capacity

    m = read_planner_section(SECTION)
    m["backend"] = {"profile": "llama-3.1-8b-h200"}
    m["prompt_tokens"] = {"mean": 12000, "p95": 30000}
    m["output_tokens"] = {"mean": 400, "p95": 900}
    m["budgets"] = {"ttft": "5s", "tbt": "30ms"}
    m["prefix_cache_hit_rate"] = 0.4
    inputs = inputs_from_mapping(m)
    raw = get_profile("llama-3.1-8b-h200")
    assert inputs.replica.itl_s(60) == pytest.approx(raw.itl_s(60, 12200))
    assert inputs.replica.prefill_tok_s < raw.prefill_tok_s / 1.5  # attention over 8.4k tokens
    assert "12200 tokens" in inputs.context_note
    cap = replica_capacity(inputs)
    assert cap.steps[0].key == "context" and cap.steps[0].formula == inputs.context_note
    # at that context the TBT budget binds, where the batch-only view is not even half-way
    assert cap.binding == "TBT budget" and cap.c < cap.c_kv
    assert inputs.replica.itl_s(cap.c) <= 0.030 < inputs.replica.itl_s(cap.c + 1)
    assert raw.itl_s(cap.c) < 0.015
    m["backend"] = {"profile": "llama-3.1-8b-h100"}  # no context terms: nothing folded
    flat = inputs_from_mapping(m)
    assert flat.context_note == "" and flat.replica == get_profile("llama-3.1-8b-h100")


@pytest.mark.parametrize(
    ("patch", "field", "text"),
    [
        ({"budgets": {"ttft": "1s", "tbt": "20ms", "p99": 1}}, "budgets.p99", "unknown key"),
        ({"backend": {"profile": "nope"}}, "backend.profile", "unknown backend profile"),
        ({"budgets": {"ttft": "soon", "tbt": "20ms"}}, "budgets.ttft", "expected a duration"),
        ({"budgets": {"ttft": "1s"}}, "missing inputs", "budgets.tbt (--tbt, e.g. 20ms)"),
        ({"tenants": {"pro": {"avg_qps": 4, "burst": 2.5}}}, "tenants.pro.burst", "whole"),
        ({"classes": {"chat": {"qps": 8, "lane": "urgent"}}}, "classes.chat.lane", "allowed"),
        ({"surprise": 1}, "surprise", "unknown key"),
    ],
)
def test_bad_sections_name_the_key(patch: dict[str, object], field: str, text: str) -> None:
    m = read_planner_section(SECTION)
    m.update(patch)
    with pytest.raises(PlanInputError) as err:
        inputs_from_mapping(m)
    assert err.value.field == field and text in err.value.message


def test_durations() -> None:
    assert parse_duration("250ms", "x") == 0.25
    assert parse_duration("2m", "x") == 120.0
    assert parse_duration(3, "x") == 3.0


def test_policy_without_planner_section_is_named() -> None:
    with pytest.raises(PlanInputError, match="no planner: section"):
        read_planner_section("version: 1\npools: {}\n", "mesh.yaml")


def test_samples_jsonl_in_the_mooncake_format(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    rows = [{"timestamp": i, "input_length": 100 * i, "output_length": 10, "hash_ids": []}
            for i in range(1, 21)]  # fmt: skip
    path.write_text("\n".join(json.dumps(r) for r in rows))
    prompt, output = load_samples(path)
    assert prompt.mean == pytest.approx(1050) and prompt.p95 == 1900
    assert output.mean == 10 and output.scv == 0.0


def test_samples_csv_and_relative_path(tmp_path: Path) -> None:
    (tmp_path / "s.csv").write_text("prompt_tokens,completion_tokens\n100,50\n300,150\n")
    m = read_planner_section(SECTION)
    del m["prompt_tokens"], m["output_tokens"]
    m["samples"] = "s.csv"
    inputs = inputs_from_mapping(m, base_dir=tmp_path)
    assert inputs.prompt.mean == 200 and inputs.output.mean == 100
    assert inputs.output.scv == pytest.approx(0.25)


def test_bad_samples(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"input_length": 5}\n')
    with pytest.raises(PlanInputError, match="row 1 lacks"):
        load_samples(tmp_path / "bad.jsonl")
    (tmp_path / "neg.jsonl").write_text('{"input_length": -5, "output_length": 3}\n')
    with pytest.raises(PlanInputError, match="≥ 0"):
        load_samples(tmp_path / "neg.jsonl")


@pytest.mark.parametrize(
    ("line", "text"),
    [
        ("7", "row 1 lacks"),  # a number, not an object: was a TypeError out of `in`
        ('"input_length output_length"', "row 1 lacks"),  # a string: was a substring test
        ('{"input_length": [1], "output_length": 3}', "row 1: not a number"),
    ],
)
def test_sample_lines_of_other_shapes_are_named(tmp_path: Path, line: str, text: str) -> None:
    path = tmp_path / "odd.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(PlanInputError, match=text):
        load_samples(path)


def test_models_that_are_not_a_list_are_named() -> None:
    m = read_planner_section(SECTION)
    m["models"] = 7
    with pytest.raises(PlanInputError) as err:
        inputs_from_mapping(m)
    assert err.value.field == "models" and "list of model names" in err.value.message
