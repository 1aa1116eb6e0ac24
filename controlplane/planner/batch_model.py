"""A batch-aware queue model of one continuous-batching replica.

M/M/c treats a replica as ``c`` independent servers that each take ``S`` seconds. A batching
server is different: all running requests share each decode step, and a step gets slower as the
batch grows (``itl(b)``), so a request finishes sooner when few others run. This module keeps the
Markov structure but lets the departure rate depend on the batch:

    state n = requests in the replica (running + queued); running k = min(n, c)
    arrivals at rate λ; departures at rate μ_n = k / S(k),  S(k) = prefill + out_mean · itl(k)

Birth–death balance gives π_n = π_0 · Π_{i≤n} λ/μ_i; for n ≥ c the rate is constant (μ_c), so the
tail is geometric with r = λ/μ_c and everything has a closed form:

    P(wait) = π_c / (1 − r),   L_q = π_c · r / (1 − r)²,   W_q = L_q / λ = P(wait) / (μ_c − λ)
    P(W_q > t) = P(wait) · exp(−(μ_c − λ)·t)   (a geometric number of exponential phases)

With a flat throughput (itl(b) = b/T) and no prefill, μ_n is constant below c: the replica is a
processor-sharing single server, which M/M/c misses entirely.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .errors import PlanInputError

__all__ = ["BatchQueue", "batch_queue"]


@dataclass(frozen=True)
class BatchQueue:
    """Steady state of one replica under the batch-aware model."""

    lam: float
    c: int
    p_wait: float
    mean_in_system: float
    mean_running: float
    mean_queued: float
    mean_wait_s: float
    drain_rate: float  # μ_c: completions per second with the batch full

    def wait_quantile(self, q: float) -> float:
        """q-quantile of the queueing wait (0 when fewer than 1 − q of arrivals wait)."""
        if not 0 < q < 1:
            raise PlanInputError("q", f"quantile must be in (0, 1), got {q}")
        if math.isinf(self.mean_wait_s):
            return math.inf
        if self.p_wait <= 1 - q:
            return 0.0
        return math.log(self.p_wait / (1 - q)) / (self.drain_rate - self.lam)

    @property
    def mean_service_s(self) -> float:
        """Mean time in service, by Little's law on the running requests: L_run / λ."""
        return self.mean_running / self.lam if self.lam > 0 else math.nan


def batch_queue(lam: float, c: int, service_s: Callable[[int], float]) -> BatchQueue:
    """Solve the batch-aware chain for arrival rate ``lam`` and batch cap ``c``.

    ``service_s(k)`` is the mean time a request spends running when ``k`` requests run together.
    Unstable load (λ ≥ c/S(c)) returns infinite queue and wait, P(wait) = 1.
    """
    if c < 1:
        raise PlanInputError("c", f"batch cap must be ≥ 1, got {c}")
    if lam < 0 or not math.isfinite(lam):
        raise PlanInputError("lam", f"arrival rate must be a finite number ≥ 0, got {lam}")
    mu = [0.0] + [k / service_s(k) for k in range(1, c + 1)]
    mu_c = mu[c]
    if lam >= mu_c:
        return BatchQueue(lam, c, 1.0, math.inf, float(c), math.inf, math.inf, mu_c)
    if lam == 0:
        return BatchQueue(0.0, c, 0.0, 0.0, 0.0, 0.0, 0.0, mu_c)
    # log π_n for n = 0..c (unnormalized), in log space: a^n/n! overflows for large c
    log_pi = [0.0]
    for n in range(1, c + 1):
        log_pi.append(log_pi[-1] + math.log(lam / mu[n]))
    top = max(log_pi)
    w = [math.exp(x - top) for x in log_pi]
    r = lam / mu_c
    tail = w[c] / (1 - r)  # Σ_{n≥c} π_n, unnormalized
    total = sum(w[:c]) + tail
    p = [x / total for x in w]
    pc = p[c]
    p_wait = pc / (1 - r)
    running = sum(n * p[n] for n in range(c)) + c * p_wait
    queued = pc * r / (1 - r) ** 2
    return BatchQueue(
        lam=lam,
        c=c,
        p_wait=p_wait,
        mean_in_system=running + queued,
        mean_running=running,
        mean_queued=queued,
        mean_wait_s=queued / lam,
        drain_rate=mu_c,
    )
