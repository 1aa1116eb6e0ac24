"""The long-prompt benchmark's smoke run (``bench/large_prompts.py`` with two requests per size):
``tokenweir up`` on the example policy and its emulated replica start, both paths answer at every
size, and the JSON comes out. Keeps the harness from rotting; it asserts that results were
produced, never how fast anything was."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


def test_large_prompts_smoke_measures_both_paths_at_every_size(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "large_prompts.py"), "--requests", "2",
         "--sizes", "3", "71", "--tag", "smoke", "--out-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "large_prompts-smoke.json").read_text())["results"]
    assert set(result) == {"3KB", "71KB"}
    for size, arms in result.items():
        s = arms["tokenweir"]
        assert s["n"] == 2, size
        assert s["direct_ms"]["p50"] > 0 and s["gateway_ms"]["p50"] > 0, size
