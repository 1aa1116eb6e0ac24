"""PNG plot of queueing wait vs utilization, every model side by side (matplotlib, Agg).

Two panels: the textbook view (M/M/c and M/G/c against their own utilization λ·S/c, the
classic hockey stick) and all three models against the plan's utilization axis (λ·τ for the
batch-aware model), where a replica really saturates.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from .capacity import MODELS, Capacity, Model, wait_estimate
from .inputs import PlanInputs

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["plot_wait_vs_utilization"]

_US = tuple(0.05 + 0.94 * k / 188 for k in range(189))


def _panel(
    ax: Axes, inputs: PlanInputs, cap: Capacity, axis: Model, models: tuple[Model, ...]
) -> None:
    q = f"p{inputs.quantile * 100:g}"
    for model in models:
        ests = [wait_estimate(inputs, cap, u * cap.rate(axis), model) for u in _US]
        (line,) = ax.plot(_US, [_ms(e.quantile_s) for e in ests], label=f"{q} {MODELS[model]}")
        ax.plot(
            _US,
            [_ms(e.mean_s) for e in ests],
            linestyle=":",
            color=line.get_color(),
            label=f"mean {MODELS[model].split(' ')[0]}",
        )
    ax.axhline(cap.queue_budget_s * 1e3, color="red", linewidth=1, label="queue budget")
    ax.set_yscale("log")
    ax.set_ylim(1e-1, max(100 * cap.queue_budget_s * 1e3, 1e4))
    ax.set_xlim(0, 1)
    ax.set_ylabel("queueing wait (ms, log scale)")
    ax.grid(True, which="both", alpha=0.3)


def plot_wait_vs_utilization(
    inputs: PlanInputs,
    cap: Capacity,
    path: Path,
    planned_utilization: float | None = None,
    measured: list[tuple[float, float]] | None = None,
    axis: Model = "batch",
) -> Path:
    """Draw mean and p-quantile wait of one replica for ρ in [0.05, 0.99]; mark the budget.

    ``measured`` adds (utilization on ``axis``, p-quantile wait in s) points from a run.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 5), dpi=100)
    left = fig.add_subplot(1, 2, 1)
    _panel(left, inputs, cap, "mmc", ("mmc", "mgc"))
    left.set_xlabel("utilization as M/M/c sees it: λ·S / c")
    left.set_title(f"Textbook view: c = {cap.c} servers of S = {cap.service_s:.3g} s", fontsize=9)
    left.legend(fontsize=7, loc="upper left")
    right = fig.add_subplot(1, 2, 2)
    _panel(right, inputs, cap, axis, tuple(MODELS))
    right.set_xlabel(
        "utilization ρ = λ·τ (one replica)" if axis == "batch" else "utilization ρ = λ·S / c"
    )
    right.set_title("All models against the plan's utilization", fontsize=9)
    if planned_utilization is not None:
        right.axvline(planned_utilization, color="grey", linestyle="--", label="planned ρ")
    if measured:
        right.scatter(
            [m[0] for m in measured],
            [max(m[1] * 1e3, 1e-2) for m in measured],
            color="black",
            zorder=5,
            label="measured",
        )
    right.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def _ms(x: float) -> float:
    """Milliseconds, with 0 and ∞ mapped to plottable values on a log axis."""
    if math.isinf(x):
        return math.nan
    return max(x * 1e3, 1e-2)
