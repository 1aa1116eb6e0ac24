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

__all__ = ["PRIOR", "Fit", "LatencyModel", "Rates"]

# the scale work is fitted in (kilo-tokens): keeps the 2x2 system well conditioned
_SCALE = 1000.0
# a replica's own rates are trusted in proportion to its evidence against this much of the
# pool's (its recent observations, decayed as the pool sees others': see ``rates``)
_SHRINK = 8.0
_BOUND = 2.0  # a replica's learned prefill rate stays within this factor of the pool's


@dataclass(frozen=True, slots=True)
class Rates:
    """What the predicted-latency scoring needs of one replica (filters/plugins/picker/score_ttft.py)."""

    # the TTFT of a request with nothing to prefill (the pool's: the same for all); the fit's
    # intercept as it is, below 0 too (clipped, a fit over a narrow range of work would
    # over-predict there by its slope times that work)
    base_s: float
    per_token_s: float  # each prompt token prefilled ahead of the first token
    step_s: float = 0.0  # its decode step with one more request in its batch (0: not learned)
    error_s: float = 0.0  # how far off the pool's TTFT predictions have recently been (mean)

    def ttft(self, work: int) -> float:
        return max(0.0, self.base_s + self.per_token_s * work)


# before any TTFT is seen: 10,000 prompt tokens/s for every replica (the decision is then the
# least prefill work ahead of the first token; the scale of the rate does not matter)
PRIOR = Rates(base_s=0.0, per_token_s=1e-4)


@dataclass(slots=True)
class Fit:
    """One recursive-least-squares fit of ``ttft = base + per_token × work``."""

    forget: float = 0.97
    count: int = 0
    error: float = 0.0  # mean absolute error of its predictions, weighted like the fit
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
        if self.count:  # (the first prediction, from nothing, says nothing of the error)
            self.error = self.forget * self.error + (1 - self.forget) * abs(err)
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
        # each replica's evidence: +1 per observation of its own, × forget per one of the pool's
        # (a replica sent nothing forgets what it looked like, back to the pool's rates)
        self.evidence: dict[str, float] = {}
        # per replica, decayed alike: its TTFTs past the pool's base, and the pool's prefill
        # prediction for the same requests (their ratio: how much slower it prefills)
        self.excess: dict[str, list[float]] = {}
        # decode step (s per output token) against the batch the request joined: a + b × running
        self.steps: dict[str, Fit] = {}
        self.pool_steps = Fit(forget=forget)

    def observe(self, replica: str, work: int, ttft: float) -> None:
        """A request with ``work`` prompt tokens ahead of its first token took ``ttft`` s."""
        if ttft < 0 or work < 0:
            return
        fit = self.replicas.get(replica)
        if fit is None:
            fit = self.replicas[replica] = Fit(forget=self.forget)
        if self.pool.count >= self.min_count:
            f = self.forget
            for other, sums in self.excess.items():
                self.evidence[other] *= f
                sums[0] *= f
                sums[1] *= f
            sums = self.excess.setdefault(replica, [0.0, 0.0])
            sums[0] += ttft - max(0.0, self.pool.theta[0])
            sums[1] += max(0.0, self.pool.theta[1]) * work / _SCALE
            self.evidence[replica] = self.evidence.get(replica, 0.0) + 1.0
        fit.update(float(work), ttft)
        self.pool.update(float(work), ttft)

    def observe_step(self, replica: str, running: int, step: float) -> None:
        """A request that joined a batch of ``running`` on ``replica`` streamed a token every
        ``step`` s after its first (the running batch in the fit's thousands, as work)."""
        if step <= 0 or running < 0:
            return
        fit = self.steps.get(replica)
        if fit is None:
            fit = self.steps[replica] = Fit(forget=self.forget)
        fit.update(running * _SCALE, step)
        self.pool_steps.update(running * _SCALE, step)

    def rates(self, replica: str, running: int = 0) -> Rates:
        """The replica's rates for the scoring, never unbounded: the base is the pool's (what
        every replica's request pays is no reason to prefer one: a replica whose first requests
        were unlucky is not starved for it); the prefill rate is the pool's times the replica's
        own factor (its recent TTFTs past the pool's base over what the pool's rate predicted
        for their prefill: a ratio of sums, not a slope, which a replica sent prompts of one
        length could not determine), kept within ``_BOUND`` of 1 and shrunk toward 1 by how
        little the replica has recently been observed (its evidence fades as the pool observes
        others: one sent nothing returns to the pool's rate). Nothing learned: ``PRIOR``.
        ``step_s``: its decode step with ``running`` requests in its batch (0: not learned)."""
        if self.pool.count < self.min_count:
            return PRIOR
        base, pool_per = self.pool.theta[0], self.pool.theta[1] / _SCALE
        pool_per = pool_per if pool_per > 0 else PRIOR.per_token_s
        factor = 1.0
        sums = self.excess.get(replica)
        if sums is not None and sums[1] > 0:
            own = min(_BOUND, max(1 / _BOUND, sums[0] / sums[1]))
            n = self.evidence.get(replica, 0.0)
            factor = (n * own + _SHRINK) / (n + _SHRINK)
        per = pool_per * factor
        return Rates(base, per, self.step(replica, running) or 0.0, self.pool.error)

    def step(self, replica: str, running: int) -> float | None:
        """Seconds per output token in a batch of ``running``; None while not learned."""
        fit = self.steps.get(replica)
        if fit is None or fit.count < self.min_count:
            fit = self.pool_steps if self.pool_steps.count >= self.min_count else None
        return None if fit is None else fit.predict(running * _SCALE)

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
        self.evidence.pop(replica, None)
        self.excess.pop(replica, None)
        self.steps.pop(replica, None)
