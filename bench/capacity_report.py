"""Render the capacity validation results: a Markdown table for docs/capacity.md and a PNG."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

__all__ = ["render_markdown", "render_plot", "update_docs"]

NAMES = {"mmc": "M/M/c", "mgc": "M/G/c", "batch": "batch"}


def _ms(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if math.isinf(x):
        return "∞"
    return f"{x * 1e3:.3g}"


def render_markdown(result: dict[str, Any]) -> str:
    p = result["plan"]
    lines = [
        f"Plan: profile `{p['profile']}`, {p['qps']:g} req/s planned, prompt {p['prompt_tokens']} "
        f"tokens, output mean {p['output_mean']:.4g} / p95 {p['output_p95']:g} (Cs² of S = "
        f"{p['cs2']:.2f}); the planner sizes {p['planned_replicas']} replicas (M/M/c would size "
        f"{p['mmc_replicas']}); **this run: {p['replicas']} replicas × {p['slots']} slots**, "
        f"S = {p['service_s']:.3g} s, τ = {p['tau_s'] * 1e3:.3g} ms, TTFT floor "
        f"{p['ttft_floor_s'] * 1e3:.3g} ms. ρ below is λ·τ per replica.",
        "",
        "Concurrency = running + queued per replica; waits and TTFT in ms. Predicted "
        "M/M/c \\| M/G/c \\| batch-aware; measured on the emulators (queue wait and server "
        "TTFT from their histograms: exact means, p95 interpolated in coarse buckets; client TTFT "
        "from the streamed first token). Predictions use the arrival rate actually offered in the "
        "window (Poisson counts vary by a few %). CPU: cores used by the emulators and the load "
        "driver, and the machine's 1-minute load average (2 cores, shared with other work).",
        "",
        "| load | ρ | requests | concurrency pred. | meas. | mean wait pred. | meas. | "
        "p95 wait pred. | meas. | TTFT p95 pred. | meas. (server / client) | CPU: ours / load avg |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        pr, me = r["predicted"], r["measured"]

        def trio(key: str, fmt: Any, pr: dict[str, Any] = pr) -> str:
            return " \\| ".join(fmt(pr[m][key]) for m in NAMES)

        lines.append(
            f"| {r['multiplier']:g}x ({r['measured_qps']:.3g}/s) | {r['utilization']:.2f} | "
            f"{r['sent']} ({r['errors']} err) | {trio('concurrency', lambda x: f'{x:.3g}')} | "
            f"**{me['concurrency']:.3g}** | {trio('queue_wait_mean_s', _ms)} | "
            f"**{_ms(me['queue_wait_mean_s'])}** | {trio('queue_wait_p95_s', _ms)} | "
            f"**{_ms(me['queue_wait_p95_s'])}** | {trio('ttft_p95_s', _ms)} | "
            f"**{_ms(me['server_ttft_p95_s'])}** / {_ms(me['ttft_p95_s'])} | "
            f"{r['cpu_cores']:.2f} / {r.get('loadavg', math.nan):.1f} |"
        )
    return "\n".join(lines) + "\n"


def render_plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    rows = result["rows"]
    xs = [r["utilization"] for r in rows]
    fig = Figure(figsize=(11, 4.5), dpi=110)
    panels = (
        ("concurrency", "mean concurrency per replica", 1.0),
        ("queue_wait_mean_s", "mean queue wait (ms)", 1e3),
        ("ttft_p95_s", "TTFT p95 (ms)", 1e3),
    )
    for k, (key, title, scale) in enumerate(panels, start=1):
        ax = fig.add_subplot(1, 3, k)
        for m, name in NAMES.items():
            ax.plot(xs, [r["predicted"][m][key] * scale for r in rows], marker=".", label=name)
        ax.plot(
            xs,
            [r["measured"][key] * scale for r in rows],
            marker="o",
            color="black",
            linestyle="none",
            label="measured",
        )
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("utilization ρ = λ·τ per replica")
        ax.grid(True, alpha=0.3)
        if k == 1:
            ax.legend(fontsize=7)
    p = result["plan"]
    fig.suptitle(f"Planner vs emulated pool ({p['replicas']} × {p['profile']})", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def update_docs(doc: Path, md: str, tag: str) -> None:
    """Replace the text between the validation markers for ``tag`` in ``doc``."""
    BEGIN, END = (
        f"<!-- capacity-validation:{tag}:begin -->",
        f"<!-- capacity-validation:{tag}:end -->",
    )
    text = doc.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{doc}: markers {BEGIN} … {END} not found")
    doc.write_text(pattern.sub(lambda _m: f"{BEGIN}\n{md}{END}", text), encoding="utf-8")


def main(argv: list[str]) -> int:
    """Re-render a saved run: capacity_report.py RESULTS.json TAG (rewrites docs and PNG)."""
    import json

    repo = Path(__file__).resolve().parents[1]
    result = json.loads(Path(argv[0]).read_text())
    tag = argv[1]
    md = render_markdown(result)
    render_plot(result, repo / "docs" / "img" / f"capacity_validation_{tag}.png")
    update_docs(repo / "docs" / "capacity.md", md, tag)
    print(md)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
