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
from typing import Any

from filters.api import BasePlugin, Context, Result
from filters.bodies import dump_body
from filters.errors import ConfigError
from filters.services import Services
from policy.routing import ENDPOINT_HEADER

__all__ = ["PdPlugin"]

_KEY = "pd"
_AFFINITY_BYTES = 1024  # the prompt's start that decides the prefill replica


def _prompt_start(ctx: Context, data: dict[str, Any]) -> bytes:
    if ctx.rendered is not None:
        return ctx.rendered[:_AFFINITY_BYTES]
    for key in ("messages", "prompt", "text", "input_ids"):
        if key in data:
            return json.dumps(data[key], ensure_ascii=False).encode()[:_AFFINITY_BYTES]
    return b""


class PdPlugin(BasePlugin):
    name = "pd"

    def __init__(self, settings: Mapping[str, Any], services: Services) -> None:
        if settings:
            raise ConfigError(f"pd: unknown setting(s) {sorted(settings)}; it has none")
        self.hub = services.pd  # None where the chain is only built to check the policy
        self.pools = services.policy.pools

    async def request_body(self, ctx: Context, body: bytes) -> Result | None:
        pool = self.pools.get(ctx.route.pool) if ctx.route.pool else None
        pd = pool.disaggregation if pool is not None else None
        if pd is None or self.hub is None:
            return None
        try:
            data = json.loads(body)
        except ValueError:
            return None  # not JSON: the decode replica answers its 400
        if not isinstance(data, dict):
            return None
        tokens = ctx.prompt_tokens if ctx.prompt_tokens is not None else len(body) // 4
        held = tokens + (ctx.max_tokens or 0)
        flight = self.hub.start(ctx.route.pool, pd, _prompt_start(ctx, data), tokens, held)
        host, _, _ = flight.prefill.rpartition(":")
        data["bootstrap_host"] = host
        data["bootstrap_port"] = self.hub.bootstrap_port(pd, flight.prefill)
        data["bootstrap_room"] = flight.room
        new = dump_body(data)
        self.hub.send_prefill(flight, ctx.path.split("?", 1)[0], new, pd)
        ctx.scratch[_KEY] = flight
        return Result(
            body=new,
            set_headers={ENDPOINT_HEADER: flight.decode, "content-length": str(len(new))},
        )

    async def response_headers(self, ctx: Context, headers: Mapping[str, str]) -> Result | None:
        flight = ctx.scratch.get(_KEY)
        if flight is not None:
            try:
                flight.decode_status = int(headers.get(":status", "0"))
            except ValueError:
                flight.decode_status = 0
        return None

    async def stream_end(self, ctx: Context) -> None:
        flight = ctx.scratch.pop(_KEY, None)
        if flight is not None and self.hub is not None:
            self.hub.finish(flight)
