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

__all__ = ["BatchPrediction", "BatchQueue", "StepResidual", "batch_predict", "batch_queue"]


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
    p_idle: float = 0.0  # π_0: probability the replica has nothing to do

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
        return BatchQueue(lam, c, 1.0, math.inf, float(c), math.inf, math.inf, mu_c, 0.0)
    if lam == 0:
        return BatchQueue(0.0, c, 0.0, 0.0, 0.0, 0.0, 0.0, mu_c, 1.0)
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
        p_idle=p[0],
    )


@dataclass(frozen=True)
class StepResidual:
    """The wait for the scheduler step in progress to end (a new request joins the next step).

    When the replica is busy (probability ``busy``), an arrival lands in a decode-only step of
    length ``d = itl(b)`` or, with time share ``mixed``, in a step that also prefills another
    request (length ``d + t_p``); it waits the rest of that step, uniform over its length.
    """

    busy: float
    decode_s: float
    prefill_s: float
    mixed: float

    @property
    def mean_s(self) -> float:
        d, m = self.decode_s, self.mixed
        return self.busy * ((1 - m) * d / 2 + m * (d + self.prefill_s) / 2)

    def _parts(self) -> tuple[tuple[float, float], ...]:
        """(probability, step length) of the uniform components; the rest is 0."""
        d, m = self.decode_s, self.mixed
        return ((self.busy * (1 - m), d), (self.busy * m, d + self.prefill_s))


def _tail_uniform_plus_wait(t: float, length: float, p_wait: float, theta: float) -> float:
    """P(U + W > t), U uniform on [0, length], P(W > x) = p_wait·e^{−θx} (x ≥ 0)."""
    if length <= 0:
        return p_wait * math.exp(-theta * t) if t >= 0 else 1.0
    if t >= length:
        return p_wait * math.exp(-theta * t) * math.expm1(theta * length) / (theta * length)
    return (length - t) / length + p_wait * -math.expm1(-theta * t) / (theta * length)


@dataclass(frozen=True)
class BatchPrediction:
    """Queueing at one replica: the batch-aware chain plus the step residual."""

    queue: BatchQueue
    residual: StepResidual

    @property
    def p_wait(self) -> float:
        return self.queue.p_wait

    @property
    def mean_wait_s(self) -> float:
        """Arrival → admission: queueing for a slot plus the rest of the current step."""
        return self.queue.mean_wait_s + self.residual.mean_s

    @property
    def mean_in_system(self) -> float:
        return self.queue.mean_in_system + self.queue.lam * self.residual.mean_s

    def tail(self, t: float) -> float:
        """P(wait > t), wait = residual + queueing (taken as independent)."""
        q = self.queue
        if math.isinf(q.mean_wait_s):
            return 1.0
        theta = q.drain_rate - q.lam
        parts = self.residual._parts()
        idle = 1.0 - sum(p for p, _ in parts)
        total = idle * (q.p_wait * math.exp(-theta * t))
        for p, length in parts:
            total += p * _tail_uniform_plus_wait(t, length, q.p_wait, theta)
        return total

    def wait_quantile(self, quant: float) -> float:
        if not 0 < quant < 1:
            raise PlanInputError("q", f"quantile must be in (0, 1), got {quant}")
        if math.isinf(self.queue.mean_wait_s):
            return math.inf
        target = 1 - quant
        if self.tail(0.0) <= target:
            return 0.0
        lo, hi = 0.0, max(self.residual.decode_s + self.residual.prefill_s, 1e-6)
        while self.tail(hi) > target:
            hi *= 2
        for _ in range(80):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self.tail(mid) > target else (lo, mid)
        return hi


def batch_predict(
    lam: float, c: int, out_mean: float, itl_s: Callable[[int], float], prefill_s: float
) -> BatchPrediction:
    """Batch-aware prediction for one replica of a continuous-batching server.

    - Prefill shares the GPU with decoding: a fraction f = λ·t_p of the time goes to prefill,
      so each decode token of a k-batch takes itl(k)/(1 − f) on average and a request holds its
      slot S(k) = out·itl(k)/(1 − f) (its own prefill step is one of those steps).
    - The chain of :func:`batch_queue` with that S(k) gives queueing for a slot.
    - A :class:`StepResidual` adds the wait for the running step to end, with d = itl(⌈L_run⌉).
    """
    f = lam * prefill_s
    if f >= 1:
        unstable = BatchQueue(lam, c, 1.0, math.inf, float(c), math.inf, math.inf, 0.0, 0.0)
        return BatchPrediction(unstable, StepResidual(1.0, itl_s(c), prefill_s, 1.0))
    q = batch_queue(lam, c, lambda k: out_mean * itl_s(k) / (1 - f))
    b = min(c, max(1, math.ceil(q.mean_running)))
    d = itl_s(b)
    mixed = min(1.0, lam * (prefill_s + d))
    return BatchPrediction(q, StepResidual(1.0 - q.p_idle, d, prefill_s, mixed))
