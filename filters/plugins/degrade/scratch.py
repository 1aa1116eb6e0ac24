"""What the ``degrade`` plugin decided for one request, kept in ``ctx.scratch`` and read by the
tokens plugin (clamp, model rewrite) and admission (which pool to gate)."""

from __future__ import annotations

from dataclasses import dataclass

from filters.api import Context
from poolstate.ladder import Effect

__all__ = [
    "RETURNED",
    "SCRATCH",
    "Degraded",
    "degraded",
    "kept_elsewhere",
    "max_tokens_cap",
    "served_model",
    "served_pool",
]

SCRATCH = "degrade"
RETURNED = "degrade.returned"  # the shed step let a client through on another process's promise


@dataclass(frozen=True, slots=True)
class Degraded:
    effect: Effect
    pool: str | None = None  # the fallback pool, when sent there
    model: str | None = None  # its model, written into the body


def degraded(ctx: Context) -> Degraded | None:
    d = ctx.scratch.get(SCRATCH)
    return d if isinstance(d, Degraded) else None


def max_tokens_cap(ctx: Context) -> int | None:
    """The ladder's cap on this request's ``max_tokens`` (None: no clamp step applies)."""
    d = degraded(ctx)
    return d.effect.max_tokens if d is not None else None


def served_model(ctx: Context) -> str | None:
    """The model this request is sent to instead of the one it asked for (a fallback)."""
    d = degraded(ctx)
    return d.model if d is not None else None


def served_pool(ctx: Context) -> str | None:
    """The pool that serves this request: the fallback pool when degraded, else the route's."""
    d = degraded(ctx)
    return d.pool if d is not None and d.pool is not None else ctx.route.pool


def kept_elsewhere(ctx: Context) -> bool:
    """The ladder's shed step let this request through because another filter process's
    ``Retry-After`` promise was kept for it (admission gives it its place: ``returned``)."""
    return ctx.scratch.get(RETURNED) is True
