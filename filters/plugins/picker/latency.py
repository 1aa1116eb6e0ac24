"""Each replica's time to first token, learned online: ``ttft ≈ base + work × per_token``.

``work`` is the prompt tokens the replica must prefill before this request's first token: the
backlog the picker sent it and its KV events have not yet shown stored, plus the request's own
uncached tokens (the picker's prediction). ``base`` is what every request pays (the path, the
scheduler's step, the first decode step); ``per_token`` is the replica's inverse prefill rate.
Both are fitted per replica by recursive least squares with exponential forgetting (old
observations weigh ``forget**age``), so a replica that slows down (a longer running batch, a
throttled GPU) is followed within about a hundred requests. A replica with too few observations of its
own borrows the pool's fit, which learns from every replica's requests.

Pure: no clock, no I/O. The picker predicts at the pick (``predict``) and, when the stream's
first token is seen, learns (``observe``) and reports the pair as routing regret
(:mod:`filters.plugins.picker.registry`, docs/operations.md "Routing regret").
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Fit", "LatencyModel"]

# the scale work is fitted in (kilo-tokens): keeps the 2x2 system well conditioned
_SCALE = 1000.0


@dataclass(slots=True)
class Fit:
    """One recursive-least-squares fit of ``ttft = base + per_token × work``."""

    forget: float = 0.97
    count: int = 0
    theta: list[float] = field(default_factory=lambda: [0.0, 0.0])  # base s, s per k-token
    # inverse covariance-like matrix P (2x2, row-major), started wide: the first points dominate
    p: list[float] = field(default_factory=lambda: [1e4, 0.0, 0.0, 1e4])

    def update(self, work: float, ttft: float) -> None:
        x0, x1 = 1.0, work / _SCALE
        p = self.p
        px0 = p[0] * x0 + p[1] * x1
        px1 = p[2] * x0 + p[3] * x1
        denom = self.forget + x0 * px0 + x1 * px1
        k0, k1 = px0 / denom, px1 / denom
        err = ttft - (self.theta[0] * x0 + self.theta[1] * x1)
        self.theta[0] += k0 * err
        self.theta[1] += k1 * err
        # P = (P - k x^T P) / forget
        xp0 = x0 * p[0] + x1 * p[2]
        xp1 = x0 * p[1] + x1 * p[3]
        f = self.forget
        self.p = [
            (p[0] - k0 * xp0) / f,
            (p[1] - k0 * xp1) / f,
            (p[2] - k1 * xp0) / f,
            (p[3] - k1 * xp1) / f,
        ]
        self.count += 1

    def predict(self, work: float) -> float:
        base = max(0.0, self.theta[0])
        per = max(0.0, self.theta[1])
        return base + per * work / _SCALE


class LatencyModel:
    """Per-replica fits and the pool's, with ``min_count`` observations before a fit is used."""

    def __init__(self, *, forget: float = 0.97, min_count: int = 8) -> None:
        if not 0.5 <= forget <= 1.0:
            raise ValueError(f"forget must be in [0.5, 1.0], got {forget}")
        self.forget = forget
        self.min_count = min_count
        self.pool = Fit(forget=forget)
        self.replicas: dict[str, Fit] = {}

    def observe(self, replica: str, work: int, ttft: float) -> None:
        """A request with ``work`` prompt tokens ahead of its first token took ``ttft`` s."""
        if ttft < 0 or work < 0:
            return
        fit = self.replicas.get(replica)
        if fit is None:
            fit = self.replicas[replica] = Fit(forget=self.forget)
        fit.update(float(work), ttft)
        self.pool.update(float(work), ttft)

    def predict(self, replica: str, work: int) -> float | None:
        """Seconds to the first token, or None while nothing has been learned."""
        fit = self.replicas.get(replica)
        if fit is not None and fit.count >= self.min_count:
            return fit.predict(float(work))
        if self.pool.count >= self.min_count:
            return self.pool.predict(float(work))
        return None

    def forget_replica(self, replica: str) -> None:
        self.replicas.pop(replica, None)
