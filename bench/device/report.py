"""Tables and plots of a lent GPU machine's run (bench/device/run.sh) for docs/benchmarks.md.

Reads ``bench/results/gpu_h200_llama8b_*.json`` and ``gpu_h200_mixed.json`` (bench/gpu_profile.py) and
``bench/results/rls_16core_*.json`` (bench/peers_rls.py on 16 cores), prints the markdown tables
that docs/benchmarks.md shows, and draws ``docs/img/gpu_h200_decode.png``,
``docs/img/gpu_h200_prefill.png`` and ``docs/img/rls_16core.png``. Beside every measured step it
puts the profile's model (``llama-3.1-8b-h200``, with its context terms) and the floor a step
cannot beat: the bytes it must read (weights, and the batch's KV for decode) over the card's
copy bandwidth (4.3 TB/s, read + written, measured on these machines).

    .venv/bin/python bench/device/report.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from backends.profiles import get_profile  # noqa: E402

RESULTS = ROOT / "bench" / "results"
IMG = ROOT / "docs" / "img"
COPY_BANDWIDTH = 4.3e12  # bytes/s, device-to-device copy on these H200s (device/KINDS.md)
PROFILE = "llama-3.1-8b-h200"


def _load(pattern: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(RESULTS.glob(pattern))]


def decode_rows(runs: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Every decode point of every run with the model and the bandwidth floor beside it."""
    p = get_profile(PROFILE)
    rows = []
    for run in runs:
        shape = run["shape"]  # a decode step reads every weight but the embedding table's
        weights = (run["params"] - shape["vocab"] * shape["hidden"]) * 2
        kv_per_token = (
            run["decode"][0]["kv_gb_read"]
            * 1e9
            / max(run["decode"][0]["batch"] * run["decode"][0]["context"], 1)
        )
        for pt in run["decode"]:
            b, ctx = pt["batch"], pt["context"]
            floor = (weights + b * ctx * kv_per_token) / COPY_BANDWIDTH * 1e3
            rows.append({
                "batch": b, "context": ctx, "ms": pt["ms"], "tok_s": pt["tok_s"],
                "model_ms": p.itl_s(b, ctx) * 1e3, "floor_ms": floor,
            })  # fmt: skip
    return sorted(rows, key=lambda r: (r["context"], r["batch"]))


def prefill_rows(runs: list[dict[str, Any]]) -> list[dict[str, float]]:
    p = get_profile(PROFILE)
    seen: dict[tuple[int, int], dict[str, float]] = {}
    for run in runs:
        for pt in run["prefill"]:
            n, cached = pt["chunk"], pt["prefix"]
            key = (cached, n)
            if key in seen:  # a repeated point: keep both times
                seen[key]["ms_again"] = pt["ms"]
                continue
            seen[key] = {
                "chunk": n, "prefix": cached, "ms": pt["ms"], "tok_s": pt["tok_s"],
                "model_ms": p.prefill_cost_s(n, n * (cached + n / 2)) * 1e3,
            }  # fmt: skip
    return [seen[k] for k in sorted(seen)]


def rls_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for i, run in enumerate(runs, 1):
        for s in run["setups"]:
            c, o = s["closed_loop_c200"], s["open_loop_half"]
            rows.append({
                "run": i, "processes": s["processes"], "loaders": s.get("loaders", 1),
                "closed_rps": c["rps"], "closed_p99": c["p99_ms"],
                "cpu_us": c["service_cpu_us_per_decision"], "open_rps": o["rps"],
                "open_p50": o["p50_ms"], "open_p99": o["p99_ms"],
                "errors": c["errors"] + o["errors"], "dropped": o.get("dropped", 0),
            })  # fmt: skip
    return rows


def mixed_rows() -> list[dict[str, Any]]:
    """Mixed steps beside the profile's charge for them (prefill part + decode part)."""
    path = RESULTS / "gpu_h200_mixed.json"
    if not path.exists():
        return []
    p = get_profile(PROFILE)
    rows = []
    for pt in json.loads(path.read_text())["mixed"]:
        n, cached, b, ctx = pt["chunk"], pt["prefix"], pt["batch"], pt["context"]
        model = p.step_s(n, b, b * ctx, n * (cached + n / 2)) * 1e3
        rows.append({**pt, "model_ms": model})
    return rows


def mixed_markdown(rows: list[dict[str, Any]]) -> str:
    out = ["| chunk N | cached P | streams B | context L | mixed step ms | prefill alone + decode "
           "alone (graph) ms | mixed / sum | profile's step ms |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        out.append(
            f"| {r['chunk']:,} | {r['prefix']:,} | {r['batch']} | {r['context']:,} | "
            f"{r['mixed_ms']:.1f} | {r['prefill_ms']:.1f} + {r['decode_graph_ms']:.1f} = "
            f"{r['sum_ms']:.1f} | {r['mixed_over_sum']:.2f} | {r['model_ms']:.1f} |"
        )
    return "\n".join(out)


def markdown(dec: list[dict[str, float]], pre: list[dict[str, float]], rls: list[Any]) -> str:
    out = ["| streams B | context L | step ms | tok/s | model ms | floor ms | step / floor |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in dec:
        out.append(
            f"| {r['batch']} | {r['context']:,} | {r['ms']:.2f} | {r['tok_s']:,.0f} | "
            f"{r['model_ms']:.2f} | {r['floor_ms']:.2f} | {r['ms'] / r['floor_ms']:.2f} |"
        )
    out += ["", "| new tokens N | cached P | ms | tok/s | model ms |", "|---|---|---|---|---|"]
    for r in pre:
        again = f" ({r['ms_again']:.1f})" if "ms_again" in r else ""
        out.append(
            f"| {r['chunk']:,} | {r['prefix']:,} | {r['ms']:.1f}{again} | {r['tok_s']:,.0f} | "
            f"{r['model_ms']:.1f} |"
        )
    out += [
        "",
        "| run | service processes | load processes | closed loop /s | closed p99 ms | service "
        "CPU µs / decision | open loop /s (half) | open p50 / p99 ms | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rls:
        out.append(
            f"| {r['run']} | {r['processes']} | {r['loaders']} | {r['closed_rps']:,.0f} | "
            f"{r['closed_p99']:.1f} | {r['cpu_us']:.0f} | {r['open_rps']:,.0f} | "
            f"{r['open_p50']:.2f} / {r['open_p99']:.2f} | {r['errors']} |"
        )
    return "\n".join(out)


def plot_decode(rows: list[dict[str, float]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for ctx in sorted({r["context"] for r in rows}):
        pts = [r for r in rows if r["context"] == ctx]
        line = ax.plot([r["batch"] for r in pts], [r["ms"] for r in pts], "o-",
                       label=f"measured, {ctx:,} tokens each")[0]  # fmt: skip
        color = line.get_color()
        ax.plot([r["batch"] for r in pts], [r["model_ms"] for r in pts], "--", color=color)
        ax.plot([r["batch"] for r in pts], [r["floor_ms"] for r in pts], ":", color=color)
    title = "Llama-3.1-8B shapes on one H200: measured (o), profile (--), bytes floor (:)"
    _finish(fig, ax, path, "decoding streams B", "one decode step (ms)", title)


def plot_prefill(rows: list[dict[str, float]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for cached in sorted({r["prefix"] for r in rows}):
        pts = [r for r in rows if r["prefix"] == cached]
        line = ax.plot([r["chunk"] for r in pts], [r["tok_s"] for r in pts], "o-",
                       label=f"measured, {cached:,} cached tokens")[0]  # fmt: skip
        ax.plot([r["chunk"] for r in pts], [r["chunk"] / r["model_ms"] * 1e3 for r in pts],
                "--", color=line.get_color())  # fmt: skip
    ax.set_xscale("log", base=2)
    title = "Prefill of one chunk on one H200: measured (o), profile (--)"
    _finish(fig, ax, path, "new tokens in the chunk N", "prefill tokens/s", title)


def _finish(fig: Any, ax: Any, path: Path, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_rls(rows: list[dict[str, Any]], path: Path) -> None:
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.8))
    for run in sorted({r["run"] for r in rows}):
        pts = [r for r in rows if r["run"] == run]
        a1.plot([r["processes"] for r in pts], [r["closed_rps"] for r in pts], "o-",
                label=f"run {run}")  # fmt: skip
        a2.plot([r["processes"] for r in pts], [r["open_p99"] for r in pts], "o-",
                label=f"run {run}")  # fmt: skip
    a1.axhline(10_000, color="grey", ls=":", label="target 10k/s")
    a2.axhline(5.0, color="grey", ls=":", label="target 5 ms")
    a1.set_xlabel("service processes (one port)")
    a1.set_ylabel("decisions/s, closed loop of 200")
    a2.set_xlabel("service processes (one port)")
    a2.set_ylabel("p99 ms, open loop at half the max")
    for a in (a1, a2):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.suptitle("Rate-limit service on 16 cores (the lent GPU machine's CPUs)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render(img: Path = IMG) -> str:
    """Draw the three plots into ``img``; return the markdown tables."""
    gpu, rls = _load("gpu_h200_llama8b_*.json"), _load("rls_16core_*.json")
    dec, pre, rr = decode_rows(gpu), prefill_rows(gpu), rls_rows(rls)
    img.mkdir(parents=True, exist_ok=True)
    plot_decode(dec, img / "gpu_h200_decode.png")
    plot_prefill(pre, img / "gpu_h200_prefill.png")
    plot_rls(rr, img / "rls_16core.png")
    return markdown(dec, pre, rr) + "\n\n" + mixed_markdown(mixed_rows())


def main() -> None:
    print(render())


if __name__ == "__main__":
    main()
