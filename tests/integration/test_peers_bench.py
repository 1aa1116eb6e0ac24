"""The gateway comparison's smoke run (``bench/peers.py --smoke``): every arm starts fresh in front
of the same emulators, every scenario (k6 saturation, k6 tier mix with bursts, the streaming
client, the budget bursts of every variant after a history on their key, the rate-limit service
alone) runs and the JSON, the markdown and the plots come out. Keeps the harness from rotting; it asserts that results were produced, never how
fast anything was. The LiteLLM arm needs the proxy in ``.venv-peers/``: CI (``CI=true``) installs
it (about a minute), so the arm cannot rot unseen; elsewhere the test runs where ``bench/peers.py``
already created it and skips otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from peers_budget import VARIANTS  # noqa: E402
from peers_litellm import ensure_venv  # noqa: E402


def _smoke(tmp_path: Path, arms: list[str], *extra: str) -> dict[str, Any]:
    out, img = tmp_path / "results", tmp_path / "img"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "peers.py"), "--smoke", "--no-install",
         "--arms", *arms, "--out-dir", str(out), "--img-dir", str(img), *extra],
        capture_output=True, text=True, timeout=540, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result: dict[str, Any] = json.loads((out / "peers.json").read_text())
    assert set(result["arms"]) == set(arms)
    for arm, r in result["arms"].items():
        assert r["saturation"]["ok"] > 0 and r["saturation"]["ok_per_s"] > 0, arm
        assert r["saturation"]["cpu_ms_per_request"]["emulator"]["ms"] > 0, arm
        assert r["mix"]["ok"] > 0 and r["mix"]["ttfb_ms"]["p50"] is not None, arm
        assert r["chunks"]["ok"] > 0 and r["chunks"]["chunk_gap_ms"]["p50"] is not None, arm
        if arm != "direct":
            bursts = [(b["variant"], b["parallel"]) for b in r["budget"]]
            assert bursts == [(v, n) for v in VARIANTS for n in (5, 10)], arm
            for b in r["budget"]:
                assert sum(b["statuses"].values()) == b["parallel"], arm
                assert b["history"]["requests"] == 2, arm  # the key's history came first
                assert {"served_ratio", "whole_share", "false_rejects"} <= set(b), arm
            assert any(b["served_tokens"] > 0 for b in r["budget"]), arm
            if arm == "tokenweir":  # its rate-limit service's counter was read
                assert all(b["false_rejects"] is not None for b in r["budget"])
    md = (out / "peers.md").read_text()
    assert "Targets:" in md and "| target | measured | met |" in md
    assert "| arm | variant | parallel | statuses | allowed | served (/ allowed) |" in md
    for name in ("peers_throughput.png", "peers_latency.png", "peers_budget.png"):
        assert (img / name).read_bytes()[:4] == b"\x89PNG"
    return result


def test_peers_smoke_runs_every_arm_and_writes_results(tmp_path: Path) -> None:
    result = _smoke(tmp_path, ["direct", "envoy", "tokenweir", "sglang-router"])
    tw = result["arms"]["tokenweir"]["saturation"]["cpu_ms_per_request"]
    assert {"envoy", "filters", "ratelimit_service"} <= set(tw)  # every process is accounted
    assert tw["filters"]["python"] and not tw["envoy"]["python"]
    rls = result["rls"]
    assert rls["closed_loop_c200"]["rps"] > 0 and rls["open_loop_half"]["calls"] > 0
    # every setup ran: the lean HTTP/2 client on one and two processes, grpc.aio on one
    assert [(s["client"], s["processes"]) for s in rls["setups"]] == [
        ("h2", 1),
        ("h2", 2),
        ("grpc", 1),
    ]
    assert all(s["closed_loop_c200"]["errors"] == 0 for s in rls["setups"])
    assert {t["name"] for t in result["targets"]} >= {
        "Python CPU ≤ 0.5 ms/request (full path)",
        "full path ≥ 30% of Envoy alone req/s",
        "RLS p99 < 5 ms, open loop at half max",
    }


def test_peers_smoke_litellm_arm(tmp_path: Path) -> None:
    in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    why = ensure_venv(install=in_ci)
    if why is not None:
        if in_ci:  # a skip here would let the arm rot: CI must be able to install it
            pytest.fail(why)
        pytest.skip(why)
    result = _smoke(tmp_path, ["litellm"], "--no-rls")
    assert "litellm" in result["arms"] and not result["skipped"]
