"""Outputs of the gateway comparison (bench/peers.py): JSON, a markdown report, PNG plots.

``write_outputs(result, out_dir, img_dir)`` writes ``peers.json`` and ``peers.md`` into
``out_dir`` and ``peers_throughput.png``, ``peers_latency.png``, ``peers_budget.png`` into
``img_dir``; docs/benchmarks.md embeds the plots. ``targets(result)`` checks issue 12's targets
and issue 36's budget targets (``budget_rows``: per arm and burst, tokens served / allowed, the
share in whole answers, overshoot, false rejects). A phase left out (``--phases``) leaves its
table and plot out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from peers_budget import SERVED_MIN, WHOLE_MIN, burst_targets

__all__ = ["PLOTS", "budget_rows", "budget_targets", "markdown", "targets", "write_outputs"]

PLOTS = ("peers_throughput.png", "peers_latency.png", "peers_budget.png")
TOKENWEIR_PY = ("filters", "ratelimit_service")  # the Python processes on the request path


def write_outputs(
    result: dict[str, Any], out_dir: Path, img_dir: Path, name: str = "peers"
) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    img_dir.mkdir(parents=True, exist_ok=True)
    result["targets"] = targets(result)
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (out_dir / f"{name}.md").write_text(markdown(result))
    arms = result["arms"].values()
    if arms and all("saturation" in a for a in arms):
        plot_throughput(result, img_dir / PLOTS[0])
    if arms and all("chunks" in a for a in arms):
        plot_latency(result, img_dir / PLOTS[1])
    if any(a.get("budget") for a in arms):
        plot_budget(result, img_dir / PLOTS[2].replace("peers", name, 1))


def _f(v: Any, digits: int = 1) -> str:
    if v is None:
        return "–"
    return f"{v:,.{digits}f}"


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _rps(result: dict[str, Any], arm: str) -> float | None:
    a = result["arms"].get(arm)
    return None if a is None or "saturation" not in a else a["saturation"]["ok_per_s"]


def python_ms(cpu: dict[str, dict[str, Any]], labels: tuple[str, ...] | None = None) -> float:
    """CPU ms per request of the Python processes (all of them, or those in ``labels``),
    the emulators excluded (they are the backend, shared by every arm)."""
    return sum(
        float(v["ms"])
        for k, v in cpu.items()
        if v["python"] and k != "emulator" and (labels is None or k in labels)
    )


def markdown(result: dict[str, Any]) -> str:
    arms = result["arms"]
    lines: list[str] = []
    if arms and all(k in a for a in arms.values() for k in ("saturation", "mix", "chunks")):
        lines += _gateway_tables(arms)
    if any(a.get("budget") for a in arms.values()):
        lines += budget_table(result)
    rls = result.get("rls")
    if rls:
        lines += rls_table(rls)
    lines += ["", "Targets:", "", "| target | measured | met |", "|---|---|---|"]
    for t in result.get("targets") or targets(result):
        met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
        lines.append(f"| {t['name']} | {t['measured']} | {met} |")
    for arm, why in result.get("skipped", {}).items():
        lines.append(f"\n{arm}: {why}")
    return "\n".join(lines) + "\n"


def _gateway_tables(arms: dict[str, Any]) -> list[str]:
    base = arms.get("direct")
    lines = [
        "| arm | req/s at saturation | vs Envoy | TTFB p50 / p99 ms (k6, mix) | total p50 / p99 ms "
        "(k6, mix) | TTFT p50 / p99 ms (client) | added TTFT p50 / p99 | chunk gap p50 / p99 ms "
        "| rejected (sat / mix) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    envoy = arms["envoy"]["saturation"]["ok_per_s"] if "envoy" in arms else None
    for name, a in arms.items():
        s, m, c = a["saturation"], a["mix"], a["chunks"]
        ratio = s["ok_per_s"] / envoy if envoy else None
        added = (
            (_sub(c["ttft_ms"]["p50"], base["chunks"]["ttft_ms"]["p50"]),
             _sub(c["ttft_ms"]["p99"], base["chunks"]["ttft_ms"]["p99"]))
            if base else (None, None)
        )  # fmt: skip
        lines.append(
            f"| {name} | {_f(s['ok_per_s'])} | {_f(ratio, 2)} "
            f"| {_f(m['ttfb_ms']['p50'])} / {_f(m['ttfb_ms']['p99'])} "
            f"| {_f(m['total_ms']['p50'])} / {_f(m['total_ms']['p99'])} "
            f"| {_f(c['ttft_ms']['p50'])} / {_f(c['ttft_ms']['p99'])} "
            f"| {_f(added[0])} / {_f(added[1])} "
            f"| {_f(c['chunk_gap_ms']['p50'], 2)} / {_f(c['chunk_gap_ms']['p99'], 2)} "
            f"| {s['rejected']} / {m['rejected']} |"
        )
    lines += ["", "CPU ms per request at saturation, per process (py = Python):", ""]
    labels = sorted({k for a in arms.values() for k in a["saturation"]["cpu_ms_per_request"]})
    lines.append("| arm | " + " | ".join(labels) + " | Python (gateway) |")
    lines.append("|---|" + "---|" * (len(labels) + 1))
    for name, a in arms.items():
        cpu = a["saturation"]["cpu_ms_per_request"]
        cells = [
            f"{cpu[k]['ms']:.3f}{' py' if cpu[k]['python'] else ''}" if k in cpu else "–"
            for k in labels
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {python_ms(cpu):.3f} |")
    return lines


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.0f}%"


def budget_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per arm and burst: the numbers of the budget table and which targets it meets."""
    rows = []
    for name, a in result["arms"].items():
        for b in a.get("budget") or ():
            fr = b.get("false_rejects")
            rows.append({
                "arm": name, "variant": b.get("variant", "trace"), "parallel": b["parallel"],
                "statuses": b["statuses"], "allowed": b["allowed_tokens"],
                "served": b.get("served_tokens"), "served_ratio": b.get("served_ratio"),
                "whole_share": b.get("whole_share"),
                "overshoot": b.get("served_overshoot_tokens"),
                "backend": b["admitted_tokens"], "backend_overshoot": b["overshoot_tokens"],
                "false_rejects": "n/a" if fr is None else round(fr),
                "unchecked": _unchecked(b),
                "finish_reasons": b.get("finish_reasons", {}),
                "met": burst_targets(b),
            })  # fmt: skip
    return rows


def _unchecked(b: dict[str, Any]) -> int | str:
    """Requests the gateway admitted without a rate-limit decision (tokenweir: Envoy's
    ``ratelimit.failure_mode_allowed``, the service not answering within its timeout)."""
    c = b.get("gateway_counters")
    if not c:
        return "n/a"
    return round(c.get("ratelimit.failure_mode_allowed", 0.0))


def budget_table(result: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "Token budgets under N parallel streams on one key, after a history of answers on it "
        "(budget = burst, refill = burst / 60 per s, sized so the burst asks twice the budget; "
        "allowed = burst + refill x elapsed; served = prompt + completion tokens the clients "
        "received; whole = share of served in answers that ended by themselves, "
        "`finish_reason: stop`; backend = prompt + generated tokens the emulators worked on; "
        "unchecked = admitted without a rate-limit decision, the service late):",
        "",
        "| arm | variant | parallel | statuses | allowed | served (/ allowed) | whole "
        "| overshoot (backend) | false rejects | unchecked | answers (stop / length) "
        "| targets met |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in budget_rows(result):
        st = ", ".join(f"{k}: {v}" for k, v in sorted(r["statuses"].items()))
        ends = r["finish_reasons"]
        met = r["met"]
        flags = " ".join(
            ("✓" if met[k] else "✗") if met[k] is not None else "–"
            for k in ("no_overshoot", "served", "whole")
        )
        served = "–" if r["served"] is None else f"{r['served']:,.0f} ({_pct(r['served_ratio'])})"
        over = "–" if r["overshoot"] is None else f"{r['overshoot']:,.0f}"
        lines.append(
            f"| {r['arm']} | {r['variant']} | {r['parallel']} | {st} | {r['allowed']:,.0f} "
            f"| {served} | {_pct(r['whole_share'])} | {over} ({r['backend_overshoot']:,.0f}) "
            f"| {r['false_rejects']} | {r['unchecked']} "
            f"| {ends.get('stop', 0)} / {ends.get('length', 0)} | {flags} |"
        )
    lines += ["", "Targets met: 0 overshoot, ≥ 90% of allowed served, ≥ 85% of it in whole answers "
              "(✓ / ✗ in that order)."]  # fmt: skip
    return lines


def budget_targets(result: dict[str, Any], arm: str = "tokenweir") -> list[dict[str, Any]]:
    """Issue 36's three budget targets over every burst of ``arm``: met in how many bursts,
    and the worst burst's number."""
    rows = [r for r in budget_rows(result) if r["arm"] == arm and r["served"] is not None]
    if not rows:
        return []
    n = len(rows)

    def worst(key: str) -> dict[str, Any]:
        return min(rows, key=lambda r: r[key] if r[key] is not None else -1.0)

    over = [r for r in rows if r["overshoot"]]
    lo_served, lo_whole = worst("served_ratio"), worst("whole_share")
    return [
        {"name": f"{arm}: 0 overshoot in every burst",
         "measured": f"{n - len(over)}/{n} bursts"
         + (f"; worst {max(r['overshoot'] for r in over):,.0f} tokens" if over else ""),
         "met": not over},
        {"name": f"{arm}: ≥ {SERVED_MIN:.0%} of allowed tokens served in every burst",
         "measured": f"{sum(1 for r in rows if r['met']['served'])}/{n} bursts; lowest "
         f"{_pct(lo_served['served_ratio'])} ({lo_served['variant']} x{lo_served['parallel']})",
         "met": all(r["met"]["served"] for r in rows)},
        {"name": f"{arm}: ≥ {WHOLE_MIN:.0%} of served tokens in whole answers in every burst",
         "measured": f"{sum(1 for r in rows if r['met']['whole'])}/{n} bursts; lowest "
         f"{_pct(lo_whole['whole_share'])} ({lo_whole['variant']} x{lo_whole['parallel']})",
         "met": all(r["met"]["whole"] for r in rows)},
    ]  # fmt: skip


def rls_table(rls: dict[str, Any]) -> list[str]:
    """The rate-limit service alone: every setup (load client, processes), both loops."""
    lines = ["", "Rate-limit service alone (gRPC, built-in HTTP/2 transport):", "",
             "| load client, service processes | loop | offered /s | decisions/s "
             "| p50 / p99 ms (client) | p99 ms (service) "
             "| cores busy: service + Redis (CPU s: service, Redis, load generator) "
             "| CPU µs/decision (service) |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    setups = rls.get("setups") or [
        {"client": "grpc", "processes": 1, "closed_loop_c200": rls["closed_loop_c200"],
         "open_loop_half": rls["open_loop_half"]}
    ]  # fmt: skip
    for s in setups:
        name = f"{s['client']}, {s['processes']}"
        for label, r in (("closed, 200 callers", s["closed_loop_c200"]),
                         ("open, half the max", s["open_loop_half"])):  # fmt: skip
            lines.append(
                f"| {name} | {label} | {_f(r.get('offered_rps') or None, 0)} | {_f(r['rps'], 0)} "
                f"| {_f(r['p50_ms'], 2)} / {_f(r['p99_ms'], 2)} | {_f(r['service_p99_ms'], 1)} "
                f"| {_f(r['cores_busy'], 2)} ({_cpu_s(r['cpu_seconds'])}) "
                f"| {_f(r['service_cpu_us_per_decision'], 0)} |"
            )
    return lines


def _cpu_s(used: dict[str, float]) -> str:
    keys = ("ratelimit_service", "redis", "load_generator")
    return ", ".join(f"{used.get(k, 0.0):.2f}" for k in keys)


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    arms = result["arms"]
    out: list[dict[str, Any]] = []
    tw, lite, envoy = (_rps(result, n) for n in ("tokenweir", "litellm", "envoy"))
    held = [b["held"] for b in arms.get("tokenweir", {}).get("budget", [])]
    if tw is not None and lite:
        ok = tw / lite >= 20 and bool(held) and all(held)
        out.append({"name": "tokenweir ≥ 20x LiteLLM req/s, 0 overshoot",
                    "measured": f"{tw / lite:.1f}x; budget held {sum(held)}/{len(held)}", "met": ok})  # fmt: skip
    else:
        out.append({"name": "tokenweir ≥ 20x LiteLLM req/s, 0 overshoot", "measured": "–", "met": None})  # fmt: skip
    if "tokenweir" in arms and "saturation" in arms["tokenweir"]:
        py = python_ms(arms["tokenweir"]["saturation"]["cpu_ms_per_request"], TOKENWEIR_PY)
        out.append({"name": "Python CPU ≤ 0.5 ms/request (full path)",
                    "measured": f"{py:.3f} ms", "met": py <= 0.5})  # fmt: skip
    if tw is not None and envoy:
        out.append({"name": "full path ≥ 30% of Envoy alone req/s",
                    "measured": f"{100 * tw / envoy:.0f}%", "met": tw / envoy >= 0.3})  # fmt: skip
    rls = result.get("rls")
    if rls:
        c, o = rls["closed_loop_c200"], rls["open_loop_half"]
        best = rls.get("best") or {"client": "grpc", "processes": 1}
        how = f" ({best['client']} client, {best['processes']} process(es))"
        out.append({"name": "RLS ≥ 10k decisions/s", "measured": f"{c['rps']:,.0f}/s" + how,
                    "met": c["rps"] >= 10_000})  # fmt: skip
        out.append({"name": "RLS p99 < 5 ms, open loop at half max",
                    "measured": f"{o['p99_ms']:.1f} ms at {o['rps']:,.0f}/s",
                    "met": o["p99_ms"] < 5.0})  # fmt: skip
        if rls.get("setups"):
            out.append(_rls_setup_target(rls["setups"]))
    out += budget_targets(result)
    return out


def _rls_setup_target(setups: list[dict[str, Any]]) -> dict[str, Any]:
    """Both rate-limit targets held by one deployable setup (its own maximum, and p99 at half
    of that maximum): the rows above judge the setup with the highest maximum, whose half-load
    p99 suffers most from sharing a small machine with its load generator."""
    name = "RLS ≥ 10k decisions/s and p99 < 5 ms at half of that, one setup"
    both = [
        s for s in setups
        if s["closed_loop_c200"]["rps"] >= 10_000 and s["open_loop_half"]["p99_ms"] < 5.0
    ]  # fmt: skip
    if not both:
        return {"name": name, "measured": "no setup", "met": False}
    s = max(both, key=lambda s: s["closed_loop_c200"]["rps"])
    c, o = s["closed_loop_c200"], s["open_loop_half"]
    measured = (f"{s['client']} client, {s['processes']} process(es): {c['rps']:,.0f}/s; "
                f"{o['p99_ms']:.1f} ms at {o['rps']:,.0f}/s")  # fmt: skip
    return {"name": name, "measured": measured, "met": True}


def plot_throughput(result: dict[str, Any], path: Path) -> None:
    arms = result["arms"]
    names = list(arms)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.bar(names, [arms[n]["saturation"]["ok_per_s"] for n in names], color="tab:blue")
    ax1.set_ylabel("streams/s at saturation (k6 closed loop)")
    ax1.set_title("Throughput, same emulators")
    labels = sorted({k for n in names for k in arms[n]["saturation"]["cpu_ms_per_request"]
                     if k != "emulator"})  # fmt: skip
    bottom = [0.0] * len(names)
    for label in labels:
        vals = [
            float(arms[n]["saturation"]["cpu_ms_per_request"].get(label, {"ms": 0.0})["ms"])
            for n in names
        ]
        ax2.bar(names, vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax2.set_ylabel("gateway CPU ms per request")
    ax2.set_title("CPU per request by process (emulators excluded)")
    ax2.legend(fontsize=7)
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_latency(result: dict[str, Any], path: Path) -> None:
    arms = result["arms"]
    names = list(arms)
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(9, 4))
    for off, (key, q, label) in enumerate(
        (
            ("ttft_ms", "p50", "TTFT p50"),
            ("ttft_ms", "p99", "TTFT p99"),
            ("total_ms", "p50", "total p50"),
            ("total_ms", "p99", "total p99"),
        )
    ):
        vals = [arms[n]["chunks"][key][q] or 0.0 for n in names]
        ax.bar([i + off * 0.2 - 0.3 for i in x], vals, width=0.2, label=label)
    ax.set_xticks(list(x), names)
    ax.set_ylabel("ms (streaming client, fixed rate, reused connections)")
    ax.set_title("Time to first token and total time per arm")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_budget(result: dict[str, Any], path: Path) -> None:
    rows = budget_rows(result)
    fig, ax = plt.subplots(figsize=(max(9, 0.45 * len(rows)), 4.5))
    labels, served, whole = [], [], []
    for r in rows:
        ratio = r["served_ratio"] if r["served_ratio"] is not None else r["backend"] / r["allowed"]
        labels.append(f"{r['arm']}\n{r['variant']} x{r['parallel']}")
        served.append(ratio)
        whole.append(ratio * (r["whole_share"] or 0.0))
    x = range(len(rows))
    over = ["tab:red" if v > 1 else "none" for v in served]
    ax.bar(x, whole, color="tab:blue", label="served in whole answers")
    ax.bar(x, [v - w for v, w in zip(served, whole, strict=True)], bottom=whole,
           color="tab:orange", label="served in answers cut short")  # fmt: skip
    ax.bar(x, served, fill=False, edgecolor=over, linewidth=1.5, label="over budget + refill")
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="budget + refill")
    ax.axhline(SERVED_MIN, color="grey", linestyle=":", linewidth=1, label="90% target")
    ax.set_xticks(list(x), labels, fontsize=6, rotation=90)
    ax.set_ylabel("tokens / allowed")
    ax.set_title("Token budgets under parallel streams (after a history of answers)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
