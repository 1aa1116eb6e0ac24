"""pd: serve a request of a PD pool (``pools.NAME.disaggregation``) on a prefill/decode pair.

At the request body (after ``tokens``, so the clamped body and its token count are final) it
picks the pair (:mod:`filters.plugins.pd.pick`), adds SGLang's bootstrap fields exactly as SGLang's
router does (``bootstrap_host``: the prefill's host, ``bootstrap_port``: its bootstrap port,
``bootstrap_room``: a random 63-bit integer), rewrites the body, sends it to the prefill replica
itself (:class:`filters.plugins.pd.hub.PdHub`) and names the decode replica for Envoy
(``x-tokenweir-endpoint``), which streams the decode side's answer to the client. Quotas,
admission, lanes and settlement see an ordinary request of the pool. On other pools it does
nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from filters.api import BasePlugin, Context, Result, Slot
from filters.bodies import json_of, write_body
from filters.errors import ConfigError
from filters.plugins.pd.hub import Flight
from filters.services import Services
from policy.routing import ENDPOINT_HEADER
from wire.jsontypes import JsonObject

__all__ = ["PdPlugin"]

_FLIGHT: Slot[Flight] = Slot("pd")  # the request's prefill/decode pair, in flight
_AFFINITY_BYTES = 1024  # the prompt's start that decides the prefill replica


def _prompt_start(ctx: Context, data: JsonObject) -> bytes:
    if ctx.rendered is not None:
        return ctx.rendered[:_AFFINITY_BYTES]
    for key in ("messages", "prompt", "text", "input_ids"):
        if key in data:
            return json.dumps(data[key], ensure_ascii=False).encode()[:_AFFINITY_BYTES]
    return b""


class PdPlugin(BasePlugin):
    name = "pd"

    def __init__(self, settings: Mapping[str, object], services: Services) -> None:
        if settings:
            raise ConfigError(f"pd: unknown setting(s) {sorted(settings)}; it has none")
        self.hub = services.pd  # None where the chain is only built to check the policy
        self.pools = services.policy.pools

    async def request_body(self, ctx: Context, body: bytes) -> Result | None:
        name = ctx.route.pool
        pool = self.pools.get(name) if name else None
        pd = pool.disaggregation if pool is not None else None
        if pd is None or self.hub is None or name is None:
            return None
        data = json_of(ctx, body)  # the tokens plugin's decode, kept on the context
        if data is None:
            return None  # not a JSON object: the decode replica answers its 400
        tokens = ctx.prompt_tokens if ctx.prompt_tokens is not None else len(body) // 4
        held = tokens + (ctx.max_tokens or 0)
        flight = self.hub.start(name, pd, _prompt_start(ctx, data), tokens, held)
        host, _, _ = flight.prefill.rpartition(":")
        data["bootstrap_host"] = host
        data["bootstrap_port"] = self.hub.bootstrap_port(pd, flight.prefill)
        data["bootstrap_room"] = flight.room
        new = write_body(ctx, data)
        self.hub.send_prefill(flight, ctx.path.split("?", 1)[0], new, pd)
        ctx.put(_FLIGHT, flight)
        return Result(
            body=new,
            set_headers={ENDPOINT_HEADER: flight.decode, "content-length": str(len(new))},
        )

    async def response_headers(self, ctx: Context, headers: Mapping[str, str]) -> Result | None:
        flight = ctx.get(_FLIGHT)
        if flight is not None:
            try:
                flight.decode_status = int(headers.get(":status", "0"))
            except ValueError:
                flight.decode_status = 0
        return None

    async def stream_end(self, ctx: Context) -> None:
        flight = ctx.take(_FLIGHT)
        if flight is not None and self.hub is not None:
            self.hub.finish(flight)
