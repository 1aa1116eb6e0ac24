"""``tokenweir plan`` end to end: parser, exit codes, report, plot, and the policy fragment."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest
import yaml

from controlplane.planner.cli import EXIT_INFEASIBLE, EXIT_INPUT, register
from controlplane.planner.fragment import fragment, merge
from controlplane.planner.plan import make_plan
from policy import load_policy_text

from .conftest import seed_inputs

REPO = Path(__file__).resolve().parents[3]
SEED_FLAGS = [
    "plan", "--decode-tok-s", "2000", "--prefill-tok-s", "10000",
    "--prompt-mean", "1000", "--prompt-p95", "3000", "--output-mean", "500",
    "--output-p95", "1200", "--ttft", "1s", "--tbt", "20ms",
    "--qps", "chat=8", "--qps", "bulk=2:batch:30s", "--tenant", "pro=4:20", "--pool", "chat",
]  # fmt: skip


def _run(argv: list[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="tokenweir")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    out, err = io.StringIO(), io.StringIO()
    code = args.func(args, out, err)
    return code, out.getvalue(), err.getvalue()


def test_text_plan_shows_formulas_and_result() -> None:
    code, out, _ = _run(SEED_FLAGS)
    assert code == 0
    assert "⌊2000 / 50⌋ = 40" in out
    assert "**Result: 6 replicas × 40 slots" in out
    assert "τ = t_p + output·itl(c)/c = 0.1 + 500·0.02/40 = 0.35 s" in out
    assert "C(c, a) =" in out and "Wait vs utilization" in out


def test_json_plan() -> None:
    code, out, _ = _run([*SEED_FLAGS, "--format", "json", "--queue-model", "mmc"])
    data = json.loads(out)
    assert code == 0 and data["replicas"] == 4 and data["slots_per_replica"] == 40  # M/M/c
    assert data["waits"]["mmc"]["p_wait"] == pytest.approx(0.004426, abs=1e-5)


def test_mmc_plan_the_batch_model_calls_overloaded_still_prints() -> None:
    """M/M/c sizes by slots alone; when its replica count leaves a replica over capacity in the
    batch-aware model (a prefill step stalls every stream), the plan still prints: the TBT line
    takes the full batch instead of an infinite mean concurrency (was an OverflowError)."""
    argv = ["plan", "--profile", "llama-3.1-8b-h100", "--prompt-mean", "2048", "--prompt-p95",
            "2048", "--output-mean", "100", "--output-p95", "300", "--ttft", "1s", "--tbt",
            "30ms", "--qps", "20", "--queue-model", "mmc", "--format", "json"]  # fmt: skip
    code, out, _ = _run(argv)
    data = json.loads(out)
    assert code == 0 and data["replicas"] == 1
    assert data["waits"]["batch"]["mean_concurrency"] is None  # unstable: no finite mean
    code, out, _ = _run(argv[:-2])
    assert code == 0 and f"itl(b̄ = {data['slots_per_replica']})" in out


def test_infeasible_and_bad_input_exit_codes() -> None:
    code, _, err = _run([*SEED_FLAGS, "--tbt", "0.1ms"])
    assert code == EXIT_INFEASIBLE and "short by" in err
    code, _, err = _run([*SEED_FLAGS, "--utilization", "1.5"])
    assert code == EXIT_INPUT and "target_utilization" in err and "over 1 by 0.5" in err
    code, _, err = _run([*SEED_FLAGS, "--qps", "x=fast"])
    assert code == EXIT_INPUT and "--qps x=fast" in err


def test_file_then_flags_override(tmp_path: Path) -> None:
    f = tmp_path / "plan.yaml"
    f.write_text(
        "planner:\n  backend: {profile: seed-2k}\n  prompt_tokens: {mean: 1000, p95: 3000}\n"
        "  output_tokens: {mean: 500, p95: 1200}\n  budgets: {ttft: 1s, tbt: 20ms}\n"
        "  classes: {chat: {qps: 8}}\n"
    )
    code, out, _ = _run(["plan", "-f", str(f), "--format", "json"])
    assert code == 0 and json.loads(out)["backend"] == "seed-2k"
    code, out, _ = _run(["plan", "-f", str(f), "--qps", "chat=16", "--format", "json"])
    assert json.loads(out)["replicas"] > 2


def test_plot_and_fragment_files(tmp_path: Path) -> None:
    png, frag = tmp_path / "w.png", tmp_path / "f.yaml"
    code, _, _ = _run([*SEED_FLAGS, "--plot", str(png), "--fragment", str(frag)])
    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    data = yaml.safe_load(frag.read_text())
    assert data["pools"]["chat"]["circuit_breakers"]["interactive"]["max_requests"] == 246


def test_fragment_merged_into_the_example_policy_validates() -> None:
    plan = make_plan(seed_inputs())
    base = yaml.safe_load((REPO / "examples" / "mesh.yaml").read_text())
    policy = load_policy_text(yaml.safe_dump(merge(base, fragment(plan))), base_dir=REPO)
    cb = policy.pools["chat"].circuit_breakers
    assert cb.interactive.max_connections == 240 and cb.interactive.max_pending_requests == 6
    assert cb.batch.max_pending_requests == plan.breakers[1].max_pending_requests
    pro = policy.tiers["pro"].quotas.tokens
    assert pro is not None and (pro.burst, pro.refill_per_second) == (84_000, 6000.0)


def test_merge_keeps_what_the_plan_does_not_set() -> None:
    plan = make_plan(seed_inputs())
    base = {
        "version": 1,
        "pools": {"chat": {"models": ["m"], "endpoints": ["127.0.0.1:30001"]}},
        "tiers": {
            "pro": {"max_tokens": 2048, "quotas": {"tokens": {"per_month": 500_000_000}}},
            "free": {"lane": "batch", "allowed_lanes": ["batch"]},
        },
    }
    policy = load_policy_text(yaml.safe_dump(merge(base, fragment(plan))))
    pro = policy.tiers["pro"]
    assert pro.max_tokens == 2048 and pro.quotas.tokens is not None
    assert pro.quotas.tokens.per_month == 500_000_000 and pro.quotas.tokens.burst == 84_000
    free = policy.tiers["free"].quotas.requests
    assert free is not None and (free.burst, free.refill_per_second) == (10, 1.0)
    assert policy.pools["chat"].models == ("m",)


def test_fragment_sizes_an_emulated_pool() -> None:
    from backends.profiles import get_profile

    inputs = seed_inputs(replica=get_profile("seed-2k"), profile_name="seed-2k", models=("m",))
    plan = make_plan(inputs)
    base = {"version": 1, "pools": {"chat": {"models": ["old"], "emulated": {"base_port": 30001}}}}
    policy = load_policy_text(yaml.safe_dump(merge(base, fragment(plan))))
    assert policy.pools["chat"].models == ("m",)
    pool = policy.pools["chat"]
    assert pool.emulated is not None
    assert (pool.emulated.replicas, pool.emulated.profile) == (plan.replicas, "seed-2k")


def test_merge_into_flag_validates_and_prints(tmp_path: Path) -> None:
    out_path = tmp_path / "merged.yaml"
    code, _, err = _run(
        [*SEED_FLAGS, "--merge-into", str(REPO / "examples/mesh.yaml"), "--output", str(out_path)]
    )
    assert code == 0, err
    assert load_policy_text(out_path.read_text(), base_dir=REPO).pools["chat"].emulated


def test_merge_into_reports_a_policy_that_does_not_validate(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\npools: {}\n")  # the plan's pool has no models here
    code, _, err = _run([*SEED_FLAGS, "--merge-into", str(bad)])
    assert code == 4 and "models" in err


def test_wired_into_the_tokenweir_command(capsys: pytest.CaptureFixture[str]) -> None:
    from tokenweir.cli import main

    assert main([*SEED_FLAGS, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["slots_per_replica"] == 40
    assert main([*SEED_FLAGS, "--ttft", "100ms"]) == EXIT_INFEASIBLE
    assert "short by" in capsys.readouterr().err


def test_half_the_inputs_names_every_missing_one_and_its_flag() -> None:
    """Was ``backend: expected a mapping, got NoneType``, and one problem at a time."""
    code, out, err = _run(["plan", "--ttft", "1s", "--qps", "5", "--prompt-mean", "900"])
    assert code == EXIT_INPUT and out == ""
    assert err == (
        "tokenweir plan: bad input: missing inputs: backend.profile (--profile NAME), or "
        "backend.decode_tok_s and backend.prefill_tok_s (--decode-tok-s, --prefill-tok-s); "
        "prompt_tokens.p95 (--prompt-p95); output_tokens.mean (--output-mean, or --samples "
        "FILE); output_tokens.p95 (--output-p95, or --samples FILE); budgets.tbt (--tbt, e.g. "
        "20ms)\n"
    )


def test_explicit_rates_name_the_missing_rate() -> None:
    argv = [a for a in SEED_FLAGS if a not in ("--prefill-tok-s", "10000")]
    code, _, err = _run(argv)
    assert code == EXIT_INPUT
    assert err.endswith("missing inputs: backend.prefill_tok_s (--prefill-tok-s)\n")
