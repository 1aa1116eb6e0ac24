"""bench/model_tokenizer.py runs end to end on a model directory (the test's small byte-level
BPE; the real models are fetched with npm only by the benchmark itself) and writes its report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chat_model import make_model_dir

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")
ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_runs_and_reports_no_mismatch(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "model")
    out = tmp_path / "out"
    argv = [sys.executable, str(ROOT / "bench" / "model_tokenizer.py"), "--model-dir",
            f"small={model}", "--cases", "10", "--rounds", "1", "--text-kib", "8",
            "--out-dir", str(out)]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((out / "model_tokenizer.json").read_text())
    row = data["models"]["small"]
    assert row["checks"] > 50 and row["mismatches"] == 0
    assert 0.99 < row["covered_share"] <= 1.0
    assert row["map_us_per_kib_model"] > 0 and row["render_us_per_request"] > 0
    assert "| small |" in (out / "model_tokenizer.md").read_text()
