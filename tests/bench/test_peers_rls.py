"""The rate-limit phase's setups (``CLIENT:PROCESSES[:LOADERS]``) and how several load generators'
results combine; one short real run with two service processes and two loaders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from peers_rls import merge_loads, parse_setup

ROOT = Path(__file__).resolve().parents[2]


def test_parse_setup() -> None:
    assert parse_setup("h2:1") == ("h2", 1, 1)
    assert parse_setup("h2:8:4") == ("h2", 8, 4)
    assert parse_setup("grpc:2") == ("grpc", 2, 1)
    for bad in ("h2", "h3:1", "h2:0", "h2:10", "h2:2:0", "h2:1:1:1"):
        with pytest.raises(ValueError, match="setup"):
            parse_setup(bad)


def _out(calls: int, p50: float, p99: float, seconds: float = 2.0) -> dict[str, object]:
    return {"calls": calls, "rps": calls / seconds, "errors": 1, "over_limit": 0, "dropped": 2,
            "offered_rps": 100.0, "seconds": seconds, "p50_ms": p50, "p99_ms": p99,
            "client": "h2"}  # fmt: skip


def test_one_loader_is_passed_through() -> None:
    one = _out(10, 1.0, 2.0)
    assert merge_loads([one]) is one


def test_several_loaders_sum_and_bound_p99() -> None:
    merged = merge_loads([_out(100, 1.0, 9.0), _out(300, 3.0, 4.0, 3.0), _out(200, 2.0, 5.0)])
    assert merged["calls"] == 600 and merged["rps"] == pytest.approx(50 + 100 + 100)
    assert merged["errors"] == 3 and merged["dropped"] == 6 and merged["offered_rps"] == 300
    assert merged["seconds"] == 3.0 and merged["loaders"] == 3
    assert merged["p50_ms"] == 2.0  # the loaders' median
    assert merged["p99_ms"] == 9.0  # the worst loader's: never lower than the combined p99


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_two_processes_two_loaders_run(tmp_path: Path) -> None:
    out = tmp_path / "rls.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "peers_rls.py"), "--seconds", "0.5", "--warmup", "0",
         "--setups", "h2:2:2", "--out", str(out)],
        capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (setup,) = json.loads(out.read_text())["setups"]
    assert (setup["processes"], setup["loaders"]) == (2, 2)
    for loop in ("closed_loop_c200", "open_loop_half"):
        assert setup[loop]["calls"] > 0 and setup[loop]["errors"] == 0, loop
        assert setup[loop]["loaders"] == 2
