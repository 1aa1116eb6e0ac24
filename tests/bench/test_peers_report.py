"""The gateway comparison's report (bench/peers_report.py): targets, markdown, plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from peers_report import budget_rows, budget_targets, markdown, python_ms, targets, write_outputs


def _arm(rps: float, cpu: dict[str, tuple[float, bool]], held: list[bool]) -> dict[str, Any]:
    q = {"p50": 10.0, "p99": 20.0, "count": 5}
    return {
        "saturation": {
            "ok_per_s": rps,
            "ok": 10,
            "rejected": 0,
            "cpu_ms_per_request": {k: {"ms": ms, "python": py} for k, (ms, py) in cpu.items()},
        },
        "mix": {"ok": 5, "rejected": 1, "ttfb_ms": q, "total_ms": q},
        "chunks": {"ok": 5, "ttft_ms": q, "chunk_gap_ms": q, "total_ms": q},
        "budget": [
            {
                "parallel": n,
                "statuses": {"200": 3, "429": n - 3},
                "allowed_tokens": 100.0,
                "admitted_tokens": 90.0 if h else 400.0,
                "overshoot_tokens": 0.0 if h else 300.0,
                "overshoot_ratio": 0.0 if h else 3.0,
                "held": h,
            }
            for n, h in zip((100, 300), held, strict=False)
        ],
    }


def _result() -> dict[str, Any]:
    emu = ("emulator", (2.0, True))
    return {
        "arms": {
            "direct": _arm(500, dict([emu]), []),
            "envoy": _arm(400, dict([emu, ("envoy", (0.1, False))]), [False, False]),
            "tokenweir": _arm(
                200,
                dict(
                    [
                        emu,
                        ("envoy", (0.5, False)),
                        ("filters", (0.35, True)),
                        ("ratelimit_service", (0.2, True)),
                        ("controlplane", (0.05, True)),
                    ]
                ),
                [True, True],
            ),
            "litellm": _arm(20, dict([emu, ("litellm", (12.0, True))]), [False, False]),
        },
        "rls": {
            "closed_loop_c200": {
                "rps": 8000.0,
                "p50_ms": 20.0,
                "p99_ms": 60.0,
                "offered_rps": 0.0,
                "service_p99_ms": 50.0,
                "cores_busy": 1.1,
                "cpu_seconds": {},
                "service_cpu_us_per_decision": 100.0,
            },
            "open_loop_half": {
                "rps": 4000.0,
                "p50_ms": 1.0,
                "p99_ms": 4.0,
                "offered_rps": 4000.0,
                "service_p99_ms": 2.5,
                "cores_busy": 0.6,
                "cpu_seconds": {},
                "service_cpu_us_per_decision": 100.0,
            },
        },
        "skipped": {},
    }


def test_targets_are_judged_from_the_measurements() -> None:
    got = {t["name"]: t for t in targets(_result())}
    assert got["tokenweir ≥ 20x LiteLLM req/s, 0 overshoot"]["met"] is False  # 10x only
    assert got["tokenweir ≥ 20x LiteLLM req/s, 0 overshoot"]["measured"].startswith("10.0x")
    py = got["Python CPU ≤ 0.5 ms/request (full path)"]
    assert py["met"] is False and py["measured"] == "0.550 ms"  # filters + RLS, not the CP
    assert got["full path ≥ 30% of Envoy alone req/s"]["met"] is True  # 50%
    assert got["RLS ≥ 10k decisions/s"]["met"] is False
    assert got["RLS p99 < 5 ms, open loop at half max"]["met"] is True


def test_an_overshoot_fails_the_litellm_target_even_when_fast() -> None:
    r = _result()
    r["arms"]["litellm"]["saturation"]["ok_per_s"] = 5.0
    assert targets(r)[0]["met"] is True
    r["arms"]["tokenweir"]["budget"][1]["held"] = False
    assert targets(r)[0]["met"] is False


def test_python_ms_leaves_out_the_emulators() -> None:
    cpu = _result()["arms"]["tokenweir"]["saturation"]["cpu_ms_per_request"]
    assert python_ms(cpu) == 0.35 + 0.2 + 0.05


def test_outputs_are_written(tmp_path: Path) -> None:
    r = _result()
    write_outputs(r, tmp_path / "out", tmp_path / "img")
    md = (tmp_path / "out" / "peers.md").read_text()
    assert "| tokenweir | 200.0 | 0.50 |" in md
    # a budget result from before the served counts: the backend's numbers only
    assert "| litellm | trace | 300 | 200: 3, 429: 297 | 100 | – | – | – (300) | n/a | n/a |" in md
    assert (tmp_path / "out" / "peers.json").exists()
    for name in ("peers_throughput.png", "peers_latency.png", "peers_budget.png"):
        assert (tmp_path / "img" / name).read_bytes()[:4] == b"\x89PNG"


def _setup(processes: int, rps: float, half_p99: float) -> dict[str, Any]:
    return {
        "client": "h2",
        "processes": processes,
        "closed_loop_c200": {"rps": rps},
        "open_loop_half": {"rps": rps / 2, "p99_ms": half_p99},
    }


def test_one_setup_must_hold_both_rate_limit_targets() -> None:
    r = _result()
    name = "RLS ≥ 10k decisions/s and p99 < 5 ms at half of that, one setup"
    # the faster setup misses the p99, the slower one misses the rate: neither holds both
    r["rls"]["setups"] = [_setup(1, 9_000, 4.0), _setup(2, 17_000, 7.1)]
    got = {t["name"]: t for t in targets(r)}[name]
    assert got["met"] is False and got["measured"] == "no setup"
    r["rls"]["setups"] = [_setup(1, 13_500, 4.0), _setup(2, 17_000, 7.1)]
    got = {t["name"]: t for t in targets(r)}[name]
    assert got["met"] is True
    assert got["measured"].startswith("h2 client, 1 process(es): 13,500/s; 4.0 ms at 6,750/s")


def _burst(variant: str, n: int, served: float, whole: float, over: float, fr: float | None
           ) -> dict[str, Any]:  # fmt: skip
    return {
        "variant": variant, "parallel": n, "statuses": {"200": 10, "429": n - 10},
        "allowed_tokens": 1000.0, "admitted_tokens": 1000.0 * served + 5,
        "overshoot_tokens": max(0.0, 1000.0 * served + 5 - 1000), "overshoot_ratio": 0.0,
        "held": True, "served_tokens": 1000.0 * served, "served_ratio": served,
        "whole_share": whole, "served_overshoot_tokens": over, "false_rejects": fr,
        "finish_reasons": {"stop": 8, "length": 2},
    }  # fmt: skip


def _budget_result() -> dict[str, Any]:
    tw = [_burst("short", 100, 0.95, 0.9, 0.0, 3.0), _burst("long", 300, 0.6, 0.4, 0.0, 0.0)]
    tw[0]["gateway_counters"] = {"ratelimit.ok": 10.0, "ratelimit.failure_mode_allowed": 2.0}
    peer = [_burst("short", 100, 1.3, 1.0, 300.0, None)]
    return {"arms": {"tokenweir": {"budget": tw}, "litellm": {"budget": peer}}, "skipped": {}}


def test_budget_rows_carry_served_whole_overshoot_and_false_rejects() -> None:
    rows = budget_rows(_budget_result())
    assert [(r["arm"], r["variant"], r["parallel"]) for r in rows] == [
        ("tokenweir", "short", 100), ("tokenweir", "long", 300), ("litellm", "short", 100)
    ]  # fmt: skip
    assert rows[0]["false_rejects"] == 3 and rows[2]["false_rejects"] == "n/a"
    assert rows[0]["met"] == {"no_overshoot": True, "served": True, "whole": True}
    assert rows[1]["met"] == {"no_overshoot": True, "served": False, "whole": False}
    assert rows[2]["met"] == {"no_overshoot": False, "served": True, "whole": True}


def test_budget_targets_name_the_worst_burst() -> None:
    got = {t["name"]: t for t in budget_targets(_budget_result())}
    over = got["tokenweir: 0 overshoot in every burst"]
    assert over["met"] is True and over["measured"] == "2/2 bursts"
    served = got["tokenweir: ≥ 90% of allowed tokens served in every burst"]
    assert served["met"] is False and served["measured"] == "1/2 bursts; lowest 60% (long x300)"
    whole = got["tokenweir: ≥ 85% of served tokens in whole answers in every burst"]
    assert whole["met"] is False and whole["measured"].endswith("lowest 40% (long x300)")
    peer = {t["name"]: t for t in budget_targets(_budget_result(), "litellm")}
    assert peer["litellm: 0 overshoot in every burst"]["measured"] == (
        "0/1 bursts; worst 300 tokens"
    )
    assert budget_targets(_budget_result(), "sglang-router") == []


def test_a_budget_only_run_writes_its_table_and_plot(tmp_path: Path) -> None:
    r = _budget_result()
    md = markdown(r)
    assert "req/s at saturation" not in md  # phases left out leave their tables out
    assert (
        "| tokenweir | short | 100 | 200: 10, 429: 90 | 1,000 | 950 (95%) | 90% | 0 (0) | 3 | 2 |"
        in md
    )
    assert (
        "| litellm | short | 100 | 200: 10, 429: 90 | 1,000 | 1,300 (130%) | 100% | 300 (305) "
        in md
    )
    assert "| n/a | n/a | 8 / 2 | ✗ ✓ ✓ |" in md  # LiteLLM: no false-reject count, no counters
    write_outputs(r, tmp_path / "out", tmp_path / "img", "budget_x")
    assert (tmp_path / "out" / "budget_x.json").exists()
    assert (tmp_path / "img" / "budget_x_budget.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "img" / "peers_throughput.png").exists()
