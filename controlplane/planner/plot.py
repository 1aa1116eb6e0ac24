"""PNG plot of queueing wait vs utilization, every model side by side (matplotlib, Agg)."""

from __future__ import annotations

import math
from pathlib import Path

from .capacity import MODELS, Capacity, Model, wait_estimate
from .inputs import PlanInputs

__all__ = ["plot_wait_vs_utilization"]


def plot_wait_vs_utilization(
    inputs: PlanInputs,
    cap: Capacity,
    path: Path,
    planned_utilization: float | None = None,
    measured: list[tuple[float, float]] | None = None,
    axis: Model = "batch",
) -> Path:
    """Draw mean and p-quantile wait of one replica for ρ in [0.05, 0.99]; mark the budget.

    ``measured`` adds (utilization, p-quantile wait in s) points from a validation run.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    us = [0.05 + 0.94 * k / 188 for k in range(189)]
    fig = Figure(figsize=(8, 5), dpi=110)
    ax = fig.add_subplot(1, 1, 1)
    q = f"p{inputs.quantile * 100:g}"
    for model, label in MODELS.items():
        ests = [wait_estimate(inputs, cap, u * cap.rate(axis), model) for u in us]
        (line,) = ax.plot(us, [_ms(e.quantile_s) for e in ests], label=f"{q} — {label}")
        ax.plot(
            us, [_ms(e.mean_s) for e in ests], linestyle=":", color=line.get_color(), label="mean"
        )
    ax.axhline(cap.queue_budget_s * 1e3, color="red", linewidth=1, label="queue budget")
    if planned_utilization is not None:
        ax.axvline(planned_utilization, color="grey", linestyle="--", label="planned ρ")
    if measured:
        ax.scatter(
            [m[0] for m in measured],
            [max(m[1] * 1e3, 1e-2) for m in measured],
            color="black",
            zorder=5,
            label=f"measured {q}",
        )
    ax.set_yscale("log")
    ax.set_ylim(1e-1, max(100 * cap.queue_budget_s * 1e3, 1e4))
    ax.set_xlabel(
        "utilization ρ = λ·τ (one replica)" if axis == "batch" else "utilization ρ = λ·S / c"
    )
    ax.set_ylabel("queueing wait (ms, log scale)")
    ax.set_title(f"Queueing wait vs utilization (c = {cap.c}, S = {cap.service_s:.3g} s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def _ms(x: float) -> float:
    """Milliseconds, with 0 and ∞ mapped to plottable values on a log axis."""
    if math.isinf(x):
        return math.nan
    return max(x * 1e3, 1e-2)
