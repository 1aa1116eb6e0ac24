"""picker: name the replica for a request (cache-aware routing, docs/plugins.md).

Runs at the request body, after ``tokens``: renders the prompt as the backend will (the emulator's
chat template, or the model's own: ``routing.tokenizer``), asks the
pool's :class:`~filters.plugins.picker.pool.PoolPicker` and sets ``x-tokenweir-endpoint: host:port``,
which the pool cluster's override-host load balancer honours (ring hash when the header is
absent, or names a host that is unhealthy, ejected or gone). Requests it cannot place (index
cold, prompt given as token ids) get no header: ring hash decides. At the stream's end it
counts the request out of its replica's in-flight load and records the cached tokens the backend
reported (predicted vs actual).

For a LoRA adapter's request (a name in the pool's ``lora.adapters``) the prompt's prefix
hashes chain from the adapter's seed, as the backend caches it (``prefixindex.adapters``); after
the ``lora`` plugin, the picker keeps adapter affinity's replica unless the index finds the
adapter's prefix cached on another.

A request the picker sends where the same new prefix is being prefilled right now waits for that
prefill first (``routing.coalesce_wait``, :mod:`filters.plugins.picker.coalesce`), extending Envoy's
message timeout for the wait.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from filters.api import BasePlugin, Context, Result, Slot
from filters.bodies import request_of
from filters.errors import ConfigError
from filters.plugins.picker.coalesce import follow
from filters.plugins.picker.pool import PoolPicker
from filters.plugins.picker.regret import Routed, observe, step_of
from filters.services import Services
from policy.routing import ENDPOINT_HEADER

__all__ = ["PickerPlugin"]


@dataclass(frozen=True, slots=True)
class _Placed:
    """Which pool's picker routed the request, and where (counted out at the stream's end)."""

    picker: PoolPicker
    routed: Routed


_PLACED: Slot[_Placed] = Slot("picker")


class PickerPlugin(BasePlugin):
    name = "picker"
    bounded = True

    def __init__(self, settings: Mapping[str, object], services: Services) -> None:
        if settings:
            raise ConfigError(f"picker: unknown setting(s) {sorted(settings)}; it has none")
        # None where the chain is only built to check the policy (the control plane's check)
        self.pickers = services.pickers

    async def request_body(self, ctx: Context, body: bytes) -> Result | None:
        pickers = self.pickers
        picker = pickers.get(ctx.route.pool) if pickers is not None else None
        if picker is None or pickers is None:
            return None
        req = request_of(ctx, body)
        if req is None:
            return None
        metrics = pickers.metrics
        data: bytes | None = None
        if req.input_ids is None:  # rendered already where the tokens plugin counted it
            data = ctx.rendered if ctx.rendered is not None else picker.render(req.kind, req.data)
        if data is None:
            metrics.fallbacks.labels(picker.pool, "no_prompt").inc()
            return None
        prompt = picker.prompt(data, picker.adapter_of(ctx.model))
        pick, wait = picker.pick_and_lead(prompt)
        placed = ctx.plan.adapter_replica  # the lora plugin's replica for this adapter
        if placed is not None and pick.replica != placed:
            if pick.reason == "cache":  # the adapter's prefix is cached there: it goes there
                ctx.plan.adapter_replica = pick.replica
            else:  # adapter affinity decides: its replica, scored by the index
                pick, wait = picker.pick_and_lead(prompt, lambda name: name == placed)
                if pick.replica is None:
                    return None  # the lora plugin's header stands
        metrics.picks.labels(picker.pool, pick.reason).inc()
        if pick.replica is None:
            metrics.fallbacks.labels(picker.pool, pick.reason).inc()
            return None
        uncached, own = picker.record_lead(prompt, pick)
        metrics.predicted_tokens.labels(picker.pool).inc(pick.predicted_tokens)
        replica = pick.replica
        routed = Routed(replica, uncached, own, pick.predicted_tokens)
        routed.running = picker.inflight.get(replica, 1)
        ctx.put(_PLACED, _Placed(picker, routed))
        if wait is not None:
            clock = picker.clock
            started = clock()
            if ctx.hold is not None:  # Envoy waits for this answer as long as the lead may take
                await ctx.hold(max(0.0, wait.lead.until - started))
            outcome = await follow(
                wait.lead, lambda: picker.stored_tokens(replica), clock,
                indexed=lambda: picker.indexed(prompt, replica, wait.marks),
            )  # fmt: skip
            metrics.coalesced.labels(picker.pool, outcome).inc()
            metrics.coalesce_wait.labels(picker.pool).observe(clock() - started)
        # what the replica must prefill before this request's first token: its backlog now
        # (this request's uncached tokens included, as record_lead counted them)
        routed.work = picker.backlog.get(replica, uncached)
        routed.predicted_ttft = picker.latency.predict(replica, routed.work)
        routed.sent = picker.clock()
        return Result(
            set_headers={ENDPOINT_HEADER: replica}, metadata=routed.metadata(picker.wall())
        )

    async def stream_end(self, ctx: Context) -> None:
        entry = ctx.take(_PLACED)
        if entry is None or self.pickers is None:
            return
        picker, routed = entry.picker, entry.routed
        picker.done(routed.replica, routed.uncached, routed.lead)
        usage = ctx.usage
        if usage is None:  # Envoy's meter read the answer: its access log entry brings it
            return
        if usage.cached_tokens:
            self.pickers.metrics.actual_tokens.labels(picker.pool).inc(usage.cached_tokens)
        first = ctx.first_token_at
        step = None if first is None else step_of(first, picker.clock(), usage.completion_tokens)
        observe(
            self.pickers.metrics, picker.latency, picker.pool, routed.replica,
            predicted_cached=routed.predicted_cached, actual_cached=usage.cached_tokens,
            prompt_tokens=usage.prompt_tokens, work=routed.work,
            predicted_ttft=routed.predicted_ttft,
            ttft=None if first is None else first - routed.sent,
            running=routed.running, step=step,
        )  # fmt: skip
