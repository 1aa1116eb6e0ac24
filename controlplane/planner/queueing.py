"""Queueing formulas the planner shows and uses: Little's law, Erlang B/C, M/M/c, M/G/c.

All functions are pure and work in seconds and requests per second. Notation:

- ``lam``  arrival rate λ (requests/s)
- ``s``    mean service time S (s); μ = 1/S
- ``c``    number of servers (here: batch slots of one replica, or of the whole pool)
- ``a``    offered load a = λ·S (Erlangs, i.e. the mean number of busy servers)
- ``rho``  utilization ρ = a/c
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .errors import PlanInputError

__all__ = [
    "allen_cunneen_factor",
    "erlang_b",
    "erlang_c",
    "little_l",
    "little_lambda",
    "little_w",
    "mgc_wait_mean",
    "mgc_wait_quantile",
    "mmc_wait_mean",
    "mmc_wait_quantile",
    "solve_increasing",
]


def little_l(lam: float, w: float) -> float:
    """Little's law L = λ·W: mean number in the system."""
    return lam * w


def little_lambda(l_mean: float, w: float) -> float:
    """Little's law solved for λ = L / W."""
    if w <= 0:
        raise PlanInputError("w", f"mean time in system must be > 0, got {w}")
    return l_mean / w


def little_w(l_mean: float, lam: float) -> float:
    """Little's law solved for W = L / λ."""
    if lam <= 0:
        raise PlanInputError("lam", f"arrival rate must be > 0, got {lam}")
    return l_mean / lam


def _check(c: int, a: float) -> None:
    if c < 1:
        raise PlanInputError("c", f"number of servers must be ≥ 1, got {c}")
    if a < 0 or not math.isfinite(a):
        raise PlanInputError("a", f"offered load must be a finite number ≥ 0, got {a}")


def erlang_b(c: int, a: float) -> float:
    """Erlang B blocking probability, by the stable recurrence B(k) = a·B(k-1)/(k + a·B(k-1))."""
    _check(c, a)
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return b


def erlang_c(c: int, a: float) -> float:
    """Erlang C: probability that an arrival waits in M/M/c, C = B / (1 − ρ(1 − B)).

    Returns 1.0 when the system is unstable (a ≥ c): every arrival waits, the queue grows forever.
    """
    _check(c, a)
    if a >= c:
        return 1.0
    b = erlang_b(c, a)
    rho = a / c
    return b / (1.0 - rho * (1.0 - b))


def mmc_wait_mean(lam: float, s: float, c: int) -> float:
    """Mean queueing wait in M/M/c: Wq = C(c, a) / (c·μ − λ) = C·S / (c − a). ∞ if a ≥ c."""
    a = lam * s
    if a >= c:
        return math.inf
    return erlang_c(c, a) * s / (c - a)


def mmc_wait_quantile(lam: float, s: float, c: int, q: float) -> float:
    """q-quantile of the M/M/c queueing wait.

    P(Wq > t) = C·exp(−(c·μ − λ)·t), so t_q = ln(C / (1 − q)) / (c·μ − λ), and 0 when C ≤ 1 − q.
    """
    if not 0.0 < q < 1.0:
        raise PlanInputError("q", f"quantile must be in (0, 1), got {q}")
    a = lam * s
    if a >= c:
        return math.inf
    pw = erlang_c(c, a)
    if pw <= 1.0 - q:
        return 0.0
    return math.log(pw / (1.0 - q)) * s / (c - a)


def allen_cunneen_factor(ca2: float, cs2: float) -> float:
    """Allen–Cunneen correction (Ca² + Cs²)/2 applied to M/M/c waits to approximate G/G/c.

    Ca² = 1 for Poisson arrivals; Cs² is the squared coefficient of variation of service time
    (1 for exponential, 0 for fixed lengths, > 1 for heavy-tailed output lengths).
    """
    if ca2 < 0 or cs2 < 0:
        raise PlanInputError("scv", f"squared coefficients of variation must be ≥ 0: {ca2}, {cs2}")
    return (ca2 + cs2) / 2.0


def mgc_wait_mean(lam: float, s: float, c: int, cs2: float) -> float:
    """M/G/c mean wait by Allen–Cunneen: Wq ≈ Wq(M/M/c) · (1 + Cs²)/2."""
    return mmc_wait_mean(lam, s, c) * allen_cunneen_factor(1.0, cs2)


def mgc_wait_quantile(lam: float, s: float, c: int, cs2: float, q: float) -> float:
    """M/G/c wait quantile: the M/M/c exponential tail with its decay scaled by (1 + Cs²)/2.

    Keeps P(wait) = C(c, a) and the mean of Allen–Cunneen; exact for Cs² = 1.
    """
    return mmc_wait_quantile(lam, s, c, q) * allen_cunneen_factor(1.0, cs2)


def solve_increasing(
    f: Callable[[float], float], target: float, lo: float, hi: float, tol: float = 1e-6
) -> float | None:
    """Smallest x in [lo, hi] with f(x) ≥ target for a non-decreasing f, by bisection.

    Returns None when even f(hi) < target, and lo when f(lo) ≥ target already.
    """
    if f(lo) >= target:
        return lo
    if f(hi) < target:
        return None
    while hi - lo > tol:
        mid = (lo + hi) / 2.0
        if f(mid) >= target:
            hi = mid
        else:
            lo = mid
    return hi
