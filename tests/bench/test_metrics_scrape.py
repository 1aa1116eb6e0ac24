"""bench/metrics_scrape.py runs end to end (a seconds-long smoke: one round, tiny pages)."""

from __future__ import annotations

import json
from pathlib import Path

import metrics_scrape


def test_the_scrape_benchmark_runs_every_arm_and_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "scrape.json"
    rc = metrics_scrape.main(
        ["--tenants", "2", "--rounds", "1", "--seconds", "0.3", "--out", str(out)]
    )
    assert rc == 0
    got = json.loads(out.read_text())["tenants"]["2"]
    assert set(got) == set(metrics_scrape.ARMS)
    assert got["idle"]["pings"] > 10 and "scrape_p50_ms" not in got["idle"]
    for arm in ("old", "switch", "new"):
        assert got[arm]["scrapes"] >= 1 and got[arm]["page_bytes"] > 1000
        assert got[arm]["cpu_ms"] > 0
    assert got["old"]["page_bytes"] == got["new"]["page_bytes"]  # the same page either way
