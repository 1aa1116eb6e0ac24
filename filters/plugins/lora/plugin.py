"""lora: serve a request for a LoRA adapter (``pools.NAME.lora``) on a replica that holds it.

At the request body (after ``tokens``, which checked that the pool serves the model: an unknown
adapter is a 404 there, like any unknown model) it picks the replica by adapter affinity
(:mod:`filters.plugins.lora.affinity`), names it for Envoy (``x-tokenweir-endpoint``, the override-host
load balancer; ring hash when that host is unhealthy or gone) and adds SGLang's ``lora_path``
(the adapter's name) to the body, which SGLang reads on its native and OpenAI endpoints. At the
stream's end the replica's in-flight count drops. The replicas' own reports correct the model
and a replica without the adapter registered is asked to load it (:mod:`filters.plugins.lora.hub`). Requests for the base model, and other pools,
it leaves alone. On a ``prefix_index`` pool the ``picker`` listed after it keeps this replica
unless the index finds the adapter's prefix cached on another (``ctx.plan.adapter_replica``:
the request then counts there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from filters.api import BasePlugin, Context, Result, Slot
from filters.bodies import json_of, write_body
from filters.errors import ConfigError
from filters.plugins.lora.affinity import AdapterAffinity
from filters.plugins.lora.hub import LOAD_S, LoraHub
from filters.services import Services
from policy.routing import ENDPOINT_HEADER

__all__ = ["LoraPlugin"]


@dataclass(frozen=True, slots=True)
class _Placed:
    """The replica the adapter's affinity placed this request on, counted out at its end."""

    affinity: AdapterAffinity
    replica: str
    adapter: str


_PLACED: Slot[_Placed] = Slot("lora")


class LoraPlugin(BasePlugin):
    name = "lora"

    def __init__(self, settings: Mapping[str, object], services: Services) -> None:
        if settings:
            raise ConfigError(f"lora: unknown setting(s) {sorted(settings)}; it has none")
        self.pools = services.policy.pools
        # the server's hub (kept across reloads); a chain built only to check the policy has none
        self.hub = (
            services.lora
            if services.lora is not None
            else LoraHub(CollectorRegistry(), offline=True)
        )

    def affinity(self, pool_name: str) -> AdapterAffinity | None:
        pool = self.pools.get(pool_name)
        lora = pool.lora if pool is not None else None
        return None if lora is None else self.hub.affinity(pool_name, lora)

    async def request_body(self, ctx: Context, body: bytes) -> Result | None:
        pool_name = ctx.route.pool
        aff = self.affinity(pool_name) if pool_name else None
        if aff is None or pool_name is None:
            return None
        pool = self.pools[pool_name]
        adapter = ctx.model
        if adapter is None or pool.lora is None or adapter not in pool.lora.adapters:
            return None  # the base model
        data = json_of(ctx, body)  # the tokens plugin's decode, kept on the context
        if data is None:
            return None  # not a JSON object: the replica answers its 400
        replicas = [str(a) for a in pool.endpoints]
        hub, lora = self.hub, pool.lora
        hub.refresh(pool_name, lora, replicas)  # the replicas' own reports, in the background
        replica = aff.pick(adapter, replicas)
        if replica is None:
            return None
        hub.preload(pool_name, lora, replicas, adapter)
        if aff.registered(replica, adapter) is False:  # not registered there: load it first
            if ctx.hold is not None:  # Envoy waits for this answer as long as a load may take
                await ctx.hold(LOAD_S)
            await hub.ensure(pool_name, lora, replica, adapter)
        ctx.put(_PLACED, _Placed(aff, replica, adapter))
        ctx.plan.adapter_replica = replica
        data["lora_path"] = adapter
        new = write_body(ctx, data)
        return Result(
            body=new, set_headers={ENDPOINT_HEADER: replica, "content-length": str(len(new))}
        )

    async def stream_end(self, ctx: Context) -> None:
        entry = ctx.take(_PLACED)
        if entry is not None:
            aff, replica, adapter = entry.affinity, entry.replica, entry.adapter
            moved = ctx.plan.adapter_replica
            if moved is not None and moved != replica:  # the picker found its prefix there
                aff.moved(adapter, replica, moved)
                replica = moved
            aff.done(replica, adapter)
