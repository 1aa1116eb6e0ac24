"""bench/routing.py's report: the gateway's picker counters and the PNG of the arms."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["picker_metrics", "plot"]


def picker_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("tokenweir_picker_") and s.name.endswith("_total"):
                key = s.name + ("{" + s.labels["reason"] + "}" if "reason" in s.labels else "")
                out[key] = out.get(key, 0.0) + s.value
    return out


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(results)
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    panels = [
        ("prefix-cache hit ratio", [results[x]["hit_ratio"] for x in arms]),
        ("TTFT p50 / p95 (ms)", None),
        ("max/mean requests per replica", [results[x]["max_over_mean"] for x in arms]),
    ]
    for ax, (title, vals) in zip(axes, panels, strict=True):
        if vals is None:
            xs = range(len(arms))
            ax.bar(
                [i - 0.2 for i in xs], [results[x]["ttft_p50_ms"] for x in arms], 0.4, label="p50"
            )
            ax.bar(
                [i + 0.2 for i in xs], [results[x]["ttft_p95_ms"] for x in arms], 0.4, label="p95"
            )
            ax.set_xticks(list(xs), arms)
            ax.legend()
        else:
            ax.bar(arms, vals)
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
