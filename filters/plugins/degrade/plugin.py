"""degrade: the pool's degradation ladder applied to one request (after identity and lane).

At the request headers the ladder's step for the route's pool is read (it advances from the
control plane's pool state) and the steps that name the request's tier or lane apply:

* ``shed``: 503 with ``Retry-After`` and an OpenAI error, through admission's reply
  (:func:`filters.plugins.admission.plugin.shed_reply`). Where the pool has an admission gate, the
  client is told its place in the lane's return order (admission's own ``Retry-After``: the
  queue and the clients told before it, at the measured drain rate, so a shed burst does not
  come back as one herd), the fresh request is counted as demand the step refused (the ladder
  leaves the step when that demand fits), and a client back when told is let through to the
  place it was promised in this pool (here or, :mod:`filters.plugins.admission.shared`, by another
  filter process; no fallback for it: its place is here). Without a gate: the step's
  remaining dwell;
* ``fallback``: ``x-tokenweir-degrade: fallback`` is set and the route re-picked; the control
  plane routes that header to the fallback pool's cluster. The tokens plugin rewrites the
  body's ``model`` to the fallback pool's first model (``ctx.plan.model``), admission gates
  the fallback pool (``ctx.plan.pool``);
* ``clamp_max_tokens``: the tokens plugin caps ``max_tokens`` at the step's value
  (``ctx.plan.max_tokens_cap``), so the reservation shrinks too.

The response says what happened: ``x-tokenweir-degraded`` (the actions) and, on a fallback,
``x-tokenweir-served-model``. A client cannot send ``x-tokenweir-degrade`` itself: the filter
server deletes every client ``x-tokenweir-*`` header first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from filters.api import BasePlugin, Context, Result
from filters.plugins.admission.core import Shed
from filters.plugins.admission.gate import Gates
from filters.plugins.admission.plugin import return_key, shed_reply
from filters.plugins.degrade.errors import LadderError
from filters.plugins.degrade.state import Ladders
from filters.services import Services
from poolstate.ladder import Effect
from wire.contract import DEGRADE_HEADER, DEGRADED_HEADER, SERVED_MODEL_HEADER

__all__ = ["DEGRADE_HEADER", "DegradePlugin"]


class DegradePlugin(BasePlugin):
    name = "degrade"
    bounded = True  # no I/O

    def __init__(self, settings: Mapping[str, object], services: Services) -> None:
        if settings:
            raise LadderError(f"degrade: unknown setting(s) {sorted(settings)}")
        self.policy = services.policy
        self.metrics = services.metrics
        ladders = getattr(services, "ladders", None)
        if ladders is None:  # a bare Services: this plugin's own (no pool state: step 0)
            ladders = Ladders(clock=services.clock)
            ladders.configure(services.policy)
        self.ladders: Ladders = ladders
        self.gates: Gates | None = getattr(services, "gates", None)

    async def request_headers(
        self, ctx: Context, headers: Mapping[str, str], end_of_stream: bool
    ) -> Result | None:
        pool = ctx.route.pool
        if pool is None:
            return None
        e = self.ladders.effect(pool, ctx.tier, ctx.lane)
        if e is None:
            return None
        lane = ctx.lane or "interactive"
        if e.shed:
            gate = self.gates.gate(pool) if self.gates is not None else None
            if gate is None or lane not in gate.core.queues:  # no promise to keep: the dwell
                return self._shed(ctx, pool, e, lane, self.ladders.retry_after(pool))
            tenant = ctx.tenant or "anonymous"
            key = return_key(tenant, headers)
            back, elsewhere = await gate.returning(lane, key)
            if not back:  # fresh: counted as demand, told a place in the lane's return order
                gate.turned_away(lane, key)
                return self._shed(ctx, pool, e, lane, gate.retry_after(lane, tenant, key))
            self.ladders.metrics.requests.labels(pool, "returned").inc()
            if elsewhere:
                ctx.plan.returned = True
            # back when told: admission gives it the place promised in this pool
            e = replace(e, shed=False, fallback=False)
            if not e.actions:
                return None
        self.ladders.count(pool, e)
        plan = ctx.plan
        plan.degraded, plan.max_tokens_cap = e.actions, e.max_tokens
        fallback = self.policy.pools[pool].fallback if e.fallback else None
        if fallback is None:
            return None
        plan.pool, plan.model = fallback, self.policy.pools[fallback].models[0]
        return Result(set_headers={DEGRADE_HEADER: "fallback"}, clear_route_cache=True)

    def _shed(self, ctx: Context, pool: str, e: Effect, lane: str, after: float) -> Result:
        self.ladders.count(pool, e)
        self.ladders.metrics.shed.labels(pool, lane).inc()  # the dashboard's lanes table
        shed = Shed(503, "degraded", after)
        if self.gates is not None:  # a scale-up under way may make it sooner
            shed = self.gates.promise(pool, shed)
        self.metrics.rejected(ctx.route.name, shed.reason, shed.status)
        return Result(reply=shed_reply(shed, lane))

    async def response_headers(self, ctx: Context, headers: Mapping[str, str]) -> Result | None:
        plan = ctx.plan
        if not plan.degraded:
            return None
        out = {DEGRADED_HEADER: ",".join(plan.degraded)}
        if plan.model is not None:
            out[SERVED_MODEL_HEADER] = plan.model
        return Result(set_headers=out)
