"""prefix: ``x-prefix-hash`` from the first K tokens of the rendered prompt, for ring hashing.

The text hashed is the system prompt plus the conversation up to and including the first
non-system message, cut at K tokens (K = the pool's ``affinity.prefix_tokens``, a multiple of
the backend's page size, or the ``tokens`` setting). So the turns of one conversation hash alike,
a long shared prefix (a document, a long system prompt) hashes alike, and a short shared system
prompt alone never sends everyone to one replica.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from filters.api import BasePlugin, Context, Result
from filters.bodies import LlmRequest, request_of
from filters.errors import ConfigError
from filters.services import Services

__all__ = ["PrefixPlugin", "prefix_hash"]


def prefix_hash(req: LlmRequest, tokens: int, services: Services, model: str) -> str:
    h = hashlib.blake2b(digest_size=8)
    h.update(model.encode())
    h.update(b"\x00")
    if req.input_ids is not None:
        h.update(",".join(map(str, req.input_ids[:tokens])).encode())
    else:
        text = req.prefix_text
        cut = services.estimator.prefix_chars(text, tokens)
        h.update(text[:cut].encode("utf-8", "surrogatepass"))
    return h.hexdigest()


class PrefixPlugin(BasePlugin):
    name = "prefix"
    bounded = True

    def __init__(self, settings: Mapping[str, object], services: Services) -> None:
        unknown = set(settings) - {"tokens", "header"}
        if unknown:
            raise ConfigError(f"prefix: unknown setting(s) {sorted(unknown)}")
        tokens = settings.get("tokens")
        if tokens is not None and (not isinstance(tokens, int) or tokens < 1):
            raise ConfigError("prefix: tokens must be a positive integer")
        self.tokens: int | None = tokens
        self.header = str(settings.get("header", "x-prefix-hash")).lower()
        self.services = services

    async def request_body(self, ctx: Context, body: bytes) -> Result | None:
        req = request_of(ctx, body)
        if req is None:
            return None
        model = ctx.model or req.model or ""
        tokens = self.tokens or ctx.route.prefix_tokens
        value = prefix_hash(req, tokens, self.services, model)
        return Result(set_headers={self.header: value}, clear_route_cache=True)
