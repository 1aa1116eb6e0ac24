"""deploy/grafana/tokenweir.json: valid Grafana JSON whose every PromQL expression names only
metrics the code exports (tests/metric_names.py reads them from the real registries)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.metric_names import exported_metric_names

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "tokenweir.json"
_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset",
}  # fmt: skip


def metric_names_in(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are neither functions, keywords,
    label names (inside ``{}``, ``by (...)``) nor ranges (``[...]``)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", text)
    found = set()
    for m in re.finditer(r"(?<![A-Za-z0-9_:.])[A-Za-z_:][A-Za-z0-9_:]*", text):
        rest = text[m.end() :].lstrip()
        if rest.startswith("(") or m.group() in _KEYWORDS:
            continue
        found.add(m.group())
    return found


def _exprs() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    return out


def test_the_parser_finds_metric_names_only() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, type) (rate(a_b_bucket{kind!="x", y="z"}[5m])))'
        " / on (pool) sglang:num_queue_reqs offset 5m"
    )
    assert metric_names_in(expr) == {"a_b_bucket", "sglang:num_queue_reqs"}


def test_every_expression_names_exported_metrics() -> None:
    exported = exported_metric_names()
    assert "tokenweir_filters_ttft_seconds_bucket" in exported  # the reader itself works
    exprs = _exprs()
    assert len(exprs) >= 25
    unknown = {
        (title, name)
        for title, expr in exprs
        for name in metric_names_in(expr)
        if name not in exported
    }
    assert unknown == set()


def test_dashboard_shape() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "tokenweir-mesh" and dash["templating"]["list"][0]["type"] == "datasource"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24
        for t in p.get("targets", []):
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
