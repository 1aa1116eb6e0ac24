"""The ladders of every pool in one filter process: current step, its logs and metrics.

:class:`Ladders` is kept across policy reloads (a pool keeps its step when its ladder is
unchanged). A step is evaluated when a request needs it and when ``/metrics`` is scraped
(the gauge reads through :meth:`Ladders.step`), so a quiet pool's step still comes down.
Each change is logged once and counted.

A shed step refuses demand before admission sees it; where the pool has an admission gate, the
gate counts the fresh requests refused (:meth:`filters.plugins.admission.gate.PoolGate.turned_away`)
in its demand reading, so the step is left as soon as that demand fits (after ``SETTLE_S`` of
measuring it), not after a blind ``min_dwell`` (:func:`poolstate.ladder.next_state`).
Clients queued for the place a ``Retry-After`` promised them are demand that holds a step, but
they do not take a higher one (``expected``): a storm's told clients coming back are not a new
spike.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from policy.degradation import DegradationPolicy
from poolstate.ladder import Effect, LadderState, effect, next_state, retry_after

__all__ = ["SETTLE_S", "LadderMetrics", "Ladders", "uses_ladder"]

SETTLE_S = 1.0  # a shed step whose refused demand is measured is left no sooner than this

log = logging.getLogger("tokenweir.ladder")
SaturationSource = Callable[[str], float | None]  # pool → saturation (None: no fresh data)


def uses_ladder(policy: Any) -> bool:
    """Some pool has a ladder and some enabled route runs the degrade plugin."""
    return any(p.degradation is not None for p in policy.pools.values()) and any(
        p.name == "degrade"
        for g in policy.gateways.values()
        for r in g.routes
        if r.filters is not None and r.filters.enabled
        for p in r.filters.plugins
    )


class LadderMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        p = "tokenweir_filters_ladder_"
        self.step = Gauge(p + "step", "current degradation step (0 = normal)", ["pool"],
                          registry=registry)  # fmt: skip
        self.changes = Counter(
            p + "changes", "ladder step changes", ["pool", "direction"], registry=registry
        )
        self.requests = Counter(
            p + "requests", "requests a ladder step affected (action returned: a client back "
            "when its Retry-After said, let through a shed step)", ["pool", "action"],
            registry=registry,
        )  # fmt: skip
        self.shed = Counter(
            p + "shed", "requests a ladder's shed step answered 503, by lane (the dashboard's "
            "lanes)", ["pool", "lane"], registry=registry,
        )  # fmt: skip


class Ladders:
    """Per-pool ladder state. A pool's level is the higher of two readings: ``saturation``
    (the control plane's pool state, set once its reader runs) and ``demand`` (this filter
    process's admission gate: its requests in flight and queued against its limit, set by the
    filter server). Admission holds a pool's excess at the gateway, so the replicas alone never
    read much past 1; the gate's queue is what makes the higher steps reachable, and it still
    reads when the control plane does not answer."""

    def __init__(
        self, *, clock: Callable[[], float], registry: CollectorRegistry | None = None
    ) -> None:
        self.clock = clock
        self.metrics = LadderMetrics(registry if registry is not None else CollectorRegistry())
        self.saturation: SaturationSource = lambda pool: None
        self.demand: SaturationSource = lambda pool: None
        # pool → the part of ``demand`` that was planned (clients back when told): it holds a
        # step but takes none
        self.expected: SaturationSource = lambda pool: None
        # pool → called when its ladder steps down (the gates stop counting refused demand)
        self.stepped_down: Callable[[str], None] = lambda pool: None
        self._policies: dict[str, DegradationPolicy] = {}
        self._states: dict[str, LadderState] = {}

    def configure(self, policy: Any) -> None:
        """Take the ladders of ``policy``; a pool whose ladder changed starts again at step 0."""
        new = {n: p.degradation for n, p in policy.pools.items() if p.degradation is not None}
        for name, ladder in new.items():
            if self._policies.get(name) != ladder:
                self._states[name] = LadderState(0, self.clock())
            if name not in self._policies:
                self.metrics.step.labels(name).set_function(partial(self.step, name))
        for name in set(self._policies) - set(new):
            self._states.pop(name, None)
            self.metrics.step.remove(name)
        self._policies = new

    def policy(self, pool: str) -> DegradationPolicy | None:
        return self._policies.get(pool)

    def step(self, pool: str) -> int:
        """The pool's step now (advanced from the pool state; a change is logged and counted)."""
        ladder = self._policies.get(pool)
        if ladder is None:
            return 0
        before = self._states.get(pool, LadderState())
        saturation, settle, expected = self._reading(pool)
        after = next_state(
            ladder, before, saturation, self.clock(), settle=settle, expected=expected
        )
        if after is not before:
            self._states[pool] = after
        if after.step != before.step:
            direction = "up" if after.step > before.step else "down"
            if direction == "down":
                self.stepped_down(pool)
            self.metrics.changes.labels(pool, direction).inc()
            actions = [s.action for s in ladder.steps[: after.step]]
            log.warning(
                "pool %s: degradation step %d -> %d (saturation %s; active: %s)",
                pool, before.step, after.step, saturation, actions or "none",
            )  # fmt: skip
        return after.step

    def level(self, pool: str) -> float | None:
        """The higher of the pool state's saturation and the gate's demand (None: neither)."""
        return self._reading(pool)[0]

    def _reading(self, pool: str) -> tuple[float | None, float | None, float]:
        """(level, settle, expected): ``settle`` is ``SETTLE_S`` where the gate's demand is read
        (it counts what a shed step refuses), else None (the step's ``min_dwell`` holds);
        ``expected``: how much of the level the gate's clients back when told make (the level
        without them is the higher of the saturation and the rest of the gate's demand)."""
        saturation, demand = self.saturation(pool), self.demand(pool)
        seen = [v for v in (saturation, demand) if v is not None]
        level = max(seen) if seen else None
        if level is None or demand is None:
            return level, None, 0.0
        back = self.expected(pool) or 0.0
        rest = [v for v in (saturation, demand - back) if v is not None]
        return level, SETTLE_S, max(0.0, level - max(rest))

    def effect(self, pool: str, tier: str | None, lane: str | None) -> Effect | None:
        """What the pool's ladder does to this request now (None: no ladder, or nothing);
        :meth:`count` counts it once the plugin has applied it."""
        ladder = self._policies.get(pool)
        if ladder is None:
            return None
        e = effect(ladder, self.step(pool), tier, lane)
        return e if e.actions else None

    def count(self, pool: str, e: Effect) -> None:
        """Count what ``e`` did to one request (a shed request is only shed)."""
        for action in ("shed",) if e.shed else e.actions:
            self.metrics.requests.labels(pool, action).inc()

    def retry_after(self, pool: str) -> float:
        ladder = self._policies.get(pool)
        state = self._states.get(pool)
        if ladder is None or state is None:
            return 1.0
        return retry_after(ladder, state, self.clock(), self._reading(pool)[1])
