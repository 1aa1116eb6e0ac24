"""The overload benchmark's smoke run (``bench/overload.py --smoke``): every arm (plain Envoy,
sglang-router, tokenweir up) starts on its own emulators, every load level and both retry
behaviours run, and the JSON, the markdown and the plots come out. Keeps the harness from rotting;
it asserts that results were produced, never how fast anything was."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


def test_overload_smoke_runs_every_arm_and_writes_results(tmp_path: Path) -> None:
    out, img = tmp_path / "results", tmp_path / "img"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "overload.py"), "--smoke",
         "--out-dir", str(out), "--img-dir", str(img)],
        capture_output=True, text=True, timeout=540, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "overload.json").read_text())
    assert set(result["levels"]) == {"envoy", "sglang-router", "tokenweir"}
    assert result["capacity_rps"] > 0
    for arm, levels in result["levels"].items():
        assert set(levels) == {"0.25x", "1x", "3x"}, arm
        for level, lanes in levels.items():
            assert lanes["all"]["requests"] > 0, (arm, level)
            assert lanes["all"]["success_rate"] is not None
        assert result["samples"][arm]["3x"], arm  # queue depth was sampled
    assert set(result["storm"]) == {"envoy", "tokenweir"}
    for arm, by_behaviour in result["storm"].items():
        assert set(by_behaviour) == {"honour", "immediate"}, arm
        assert sum(result["timelines"][arm]["honour"]["offered_all"]) > 0
    assert {r["name"] for r in result["targets"]["tokenweir"]} >= {
        "interactive success",
        "Retry-After accuracy",
        "pool goodput vs 1x",
    }
    md = (out / "overload.md").read_text()
    assert "| sglang-router | 3x | interactive |" in md and "Targets at 3x" in md
    for name in ("overload_queues.png", "overload_ttft.png", "overload_storm.png"):
        assert (img / name).read_bytes()[:4] == b"\x89PNG"
