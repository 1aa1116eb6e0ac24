"""Errors raised by ``controlplane.planner``.

Exception tree::

    PlannerError
    ├── PlanInputError (also ValueError)   an input is malformed or out of range
    │                                      (negative rate, p95 below the mean, utilization ≥ 1, …)
    └── InfeasibleError                    the inputs are valid but no replica count meets them;
                                           says which constraint fails and by how much
"""

from __future__ import annotations

__all__ = ["InfeasibleError", "PlanInputError", "PlannerError"]


class PlannerError(Exception):
    """Base of every error raised by the capacity planner."""


class PlanInputError(PlannerError, ValueError):
    """One input is invalid; ``field`` names it (dotted path, e.g. ``classes.chat.qps``)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class InfeasibleError(PlannerError):
    """A constraint cannot be met.

    ``required`` and ``available`` are in ``unit``; ``shortfall`` is how far apart they are
    (always positive), so an operator can see by how much the plan misses.
    """

    def __init__(
        self, constraint: str, *, required: float, available: float, unit: str, hint: str = ""
    ) -> None:
        self.constraint = constraint
        self.required = required
        self.available = available
        self.unit = unit
        self.shortfall = abs(required - available)
        self.hint = hint
        text = (
            f"infeasible: {constraint}: needs {_num(required)} {unit}, "
            f"has {_num(available)} {unit} (short by {_num(self.shortfall)} {unit})"
        )
        if hint:
            text += f"; {hint}"
        super().__init__(text)


def _num(x: float) -> str:
    return f"{x:.6g}"
