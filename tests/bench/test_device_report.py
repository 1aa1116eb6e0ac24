"""bench/device/report.py renders the lent GPU machine's committed results (the device is not
there in CI: this keeps the report from rotting against the results and the profile)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _report():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("device_report", ROOT / "bench/device/report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_report_renders_tables_and_plots(tmp_path: Path) -> None:
    text = _report().render(tmp_path)
    for name in ("gpu_h200_decode.png", "gpu_h200_prefill.png", "rls_16core.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    assert "| streams B | context L | step ms |" in text
    assert "| 64 | 12,288 | 30.89 |" in text  # a measured decode step, as committed
    assert "mixed / sum" in text and "| 8 | 4 |" in text  # mixed steps; 8 service processes


def test_decode_floor_is_below_every_measured_step() -> None:
    report = _report()
    rows = report.decode_rows(report._load("gpu_h200_llama8b_*.json"))
    assert len(rows) >= 20
    assert all(r["floor_ms"] < r["ms"] for r in rows)  # nothing reads its bytes faster
