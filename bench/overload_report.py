"""Outputs of the overload benchmark: the JSON result, a markdown table, PNG plots (matplotlib).

``write_outputs(result, out_dir, img_dir)`` writes ``overload.json`` and ``overload.md`` into
``out_dir`` and ``overload_queues.png``, ``overload_ttft.png``, ``overload_storm.png`` into
``img_dir``; docs/benchmarks.md embeds the plots and copies the tables.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

__all__ = ["markdown", "write_outputs"]

PLOTS = ("overload_queues.png", "overload_ttft.png", "overload_storm.png")


def write_outputs(result: dict[str, Any], out_dir: Path, img_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    img_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "overload.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (out_dir / "overload.md").write_text(markdown(result))
    plot_queues(result, img_dir / PLOTS[0])
    plot_ttft(result, img_dir / PLOTS[1])
    plot_storm(result, img_dir / PLOTS[2])


def _f(v: Any, digits: int = 0) -> str:
    if v is None:
        return "–"
    if isinstance(v, float) and digits == 0:
        return f"{v:,.0f}"
    return f"{v:,.{digits}f}"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| arm | load | lane | goodput tok/s | TTFT p50 / p95 / p99 ms | TBT p50 / p95 / p99 ms "
        "| success (first try) | rejections | rejection p99 ms (by reason: n: p50 / p99) "
        "| with Retry-After "
        "| Retry-After accuracy |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, levels in result["levels"].items():
        for level, lanes in levels.items():
            for lane in ("interactive", "batch", "all"):
                s = lanes[lane]
                t, g = s["ttft_ms"], s["tbt_ms"]
                lines.append(
                    f"| {arm} | {level} | {lane} | {_f(s['goodput_tok_s'])} "
                    f"| {_f(t['p50'])} / {_f(t['p95'])} / {_f(t['p99'])} "
                    f"| {_f(g['p50'])} / {_f(g['p95'])} / {_f(g['p99'])} "
                    f"| {_pct(s['success_rate'])} ({_pct(s['first_try_success'])}) "
                    f"| {s['rejections']} {_statuses(s['rejection_statuses'])}"
                    f"| {_f(s['rejection_ms_p99'], 1)}{_by_reason(s)} "
                    f"| {_pct(s['rejections_with_retry_after'])} "
                    f"| {_pct(s['retry_after_accuracy'])} ({s['retries_after_retry_after']}) |"
                )
    lines += [
        "",
        "Targets at 3x:",
        "",
        "| arm | target | wanted | measured | met |",
        "|---|---|---|---|---|",
    ]
    for arm, rows in result.get("targets", {}).items():
        for r in rows:
            met = {True: "**yes**", False: "**no**", None: "n/a"}[r["met"]]
            lines.append(
                f"| {arm} | {r['name']} | {r['target']} | {_f(r['measured'], 3)} | {met} |"
            )
    if result.get("storm"):
        lines += [
            "",
            "Retry storm (spike of 3x between the marks):",
            "",
            "| arm | clients | requests | attempts | attempts per success | success "
            "| offered req/s, 5–10 s after the spike | base req/s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for arm, by_b in result["storm"].items():
            for b, row in by_b.items():
                s = row["summary"]
                tail = _tail_rate(result["timelines"][arm][b], row["spike"][1])
                lines.append(
                    f"| {arm} | {b} | {s['requests']} | {s['attempts']} "
                    f"| {_f(s['attempts_per_success'], 2)} | {_pct(s['success_rate'])} "
                    f"| {_f(tail, 1)} | {_f(row['base_rps'], 1)} |"
                )
    return "\n".join(lines) + "\n"


def _by_reason(s: dict[str, Any]) -> str:
    """Per reason: how many, p50 / p99 ms (older results: p99 only, where two reasons or more)."""
    full = s.get("rejection_ms_by_reason")
    if full:
        return " (" + ", ".join(
            f"{k} {v['n']}: {_f(v['p50'], 1)} / {_f(v['p99'], 1)}" for k, v in full.items()
        ) + ")"  # fmt: skip
    by = s.get("rejection_ms_p99_by_reason") or {}
    if len(by) < 2:
        return ""
    return " (" + ", ".join(f"{k}: {_f(v, 1)}" for k, v in by.items()) + ")"


def _statuses(counts: dict[str, int]) -> str:
    return "(" + ", ".join(f"{k}: {v}" for k, v in counts.items()) + ") " if counts else ""


def _tail_rate(tl: dict[str, list[float]], spike_end: float, span: float = 5.0) -> float | None:
    """Mean offered attempts/s over the last ``span`` s of arrivals after the spike's end."""
    t, offered = tl["t"], tl["offered_all"]
    pick = [
        o for x, o in zip(t, offered, strict=True) if spike_end + 5.0 <= x < spike_end + 5.0 + span
    ]
    return sum(pick) / len(pick) if pick else None


def plot_queues(result: dict[str, Any], path: Path) -> None:
    arms = list(result["samples"])
    levels = [k for k in next(iter(result["samples"].values()), {}) if float(k.rstrip("x")) >= 1]
    if not arms or not levels:
        return
    fig, axes = plt.subplots(
        len(levels), len(arms), figsize=(4.2 * len(arms), 2.6 * len(levels)), squeeze=False,
        sharex=True,
    )  # fmt: skip
    for i, level in enumerate(levels):
        for j, arm in enumerate(arms):
            ax = axes[i][j]
            rows = result["samples"][arm].get(level, [])
            t = [r["t"] for r in rows]
            for key, label in (
                ("waiting_interactive", "waiting for 1st token: interactive"),
                ("waiting_batch", "waiting for 1st token: batch"),
                ("backend_queued", "backend queue (sglang:num_queue_reqs)"),
                ("gateway_queued_interactive", "gateway queue: interactive"),
                ("gateway_queued_batch", "gateway queue: batch"),
            ):
                if rows and any(key in r for r in rows):
                    ax.plot(t, [r.get(key, 0.0) for r in rows], label=label, lw=1)
            ax.set_title(f"{arm}, {level}", fontsize=9)
            if j == 0:
                ax.set_ylabel("requests")
            if i == len(levels) - 1:
                ax.set_xlabel("s")
    handles, labels = [], []
    for ax in fig.axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_ttft(result: dict[str, Any], path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), squeeze=False)
    for k, lane in enumerate(("interactive", "batch")):
        ax = axes[0][k]
        for arm, levels in result["levels"].items():
            xs = [float(key.rstrip("x")) for key in levels]
            ys = [levels[key][lane]["ttft_ms"]["p95"] for key in levels]
            pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=arm)
        ax.set_yscale("log")
        ax.set_title(f"{lane}: TTFT p95 (successful requests)", fontsize=9)
        ax.set_xlabel("offered load (x capacity)")
        ax.set_ylabel("ms")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_storm(result: dict[str, Any], path: Path) -> None:
    tls = result.get("timelines", {})
    if not tls:
        return
    arms = list(tls)
    behaviours = sorted({b for v in tls.values() for b in v})
    fig, axes = plt.subplots(
        len(arms), len(behaviours), figsize=(5 * len(behaviours), 2.8 * len(arms)),
        squeeze=False, sharey="row",
    )  # fmt: skip
    for i, arm in enumerate(arms):
        for j, b in enumerate(behaviours):
            ax = axes[i][j]
            tl = tls[arm].get(b)
            if tl is None:
                continue
            ax.plot(tl["t"], tl["offered_all"], label="offered (attempts/s)", lw=1)
            ax.plot(tl["t"], tl["started_all"], label="admitted (streams started/s)", lw=1)
            ax.plot(tl["t"], tl["rejected_all"], label="rejected/s", lw=0.8, ls=":")
            lo, hi = result["storm"][arm][b]["spike"]
            ax.axvspan(lo, hi, color="grey", alpha=0.15)
            ax.axhline(result["storm"][arm][b]["base_rps"], color="black", lw=0.6, ls="--")
            ax.set_yscale("symlog", linthresh=10)
            ax.set_title(
                f"{arm}: clients that {'honour Retry-After' if b == 'honour' else 'retry at once'}",
                fontsize=9,
            )
            ax.set_xlabel("s")
            if j == 0:
                ax.set_ylabel("requests/s")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
