"""The Prometheus rules in deploy/prometheus/ are valid (`promtool check rules`), every alert has
a unit test that makes it fire (`promtool test rules`), and every recorded or alerted metric name
is one docs/metrics.md lists."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy" / "prometheus"
RULES = sorted((PROM / "rules").glob("*.yml"))
TESTS = sorted((PROM / "tests").glob("*.yml"))


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(
                "promtool missing: scripts/ensure-system-deps.sh installs Debian's prometheus"
            )
        pytest.skip("promtool not installed (apt install prometheus)")
    return found


def _rules() -> list[dict[str, object]]:
    return [r for f in RULES for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]]


def test_promtool_check_rules() -> None:
    done = subprocess.run(
        [promtool(), "check", "rules", *map(str, RULES)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert RULES, "no rule files"


def test_promtool_unit_tests_pass() -> None:
    done = subprocess.run(
        [promtool(), "test", "rules", *map(str, TESTS)],
        capture_output=True, text=True, cwd=PROM / "tests",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_firing_test_case() -> None:
    alerts = {str(r["alert"]) for r in _rules() if "alert" in r}
    firing: set[str] = set()
    for f in TESTS:
        for case in yaml.safe_load(f.read_text())["tests"]:
            for t in case.get("alert_rule_test", []):
                if t.get("exp_alerts"):
                    firing.add(t["alertname"])
    assert alerts, "no alerts"
    assert alerts - firing == set(), "alerts without a test that makes them fire"
    assert firing - alerts == set(), "tests of alerts that do not exist"


def test_rules_use_only_catalogued_metrics() -> None:
    doc = (ROOT / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `([a-zA-Z_:][a-zA-Z0-9_:]*)` \|", doc, re.M))
    used: set[str] = set()
    for r in _rules():
        expr = str(r["expr"])
        expr = re.sub(r'"[^"]*"', "", expr)  # label values
        expr = re.sub(r"\{[^}]*\}", "", expr)  # matchers
        expr = re.sub(r"\bby \([^)]*\)|\bon \([^)]*\)|group_left \([^)]*\)", "", expr)
        for name in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
            if name.startswith(("tokenweir", "envoy_", "sglang:")):
                used.add(re.sub(r"_(bucket|count|sum)$", "", name))
    assert used, "no metric names found"
    assert used - documented - {"up"} == set()
