"""Regression tests from a review of the request path (budget bypasses found by reading it)."""

from __future__ import annotations

import json

from filters.plugins.tokens import TokensPlugin
from filters.services import Services
from tests.filters.conftest import make_ctx


def _chat(**kw: object) -> bytes:
    msgs = [{"role": "user", "content": "Tell me about weirs and rivers."}]
    return json.dumps({"model": "llama-3.1-8b", "messages": msgs, **kw}).encode()


def _backend_max_tokens(body: dict[str, object]) -> object:
    """What SGLang, vLLM and the emulator use: max_completion_tokens first, then max_tokens."""
    return body.get("max_completion_tokens") or body.get("max_tokens")


async def test_both_max_token_fields_are_clamped(services: Services) -> None:
    # a small max_tokens must not hide a huge max_completion_tokens from the clamp
    for kw in (
        {"max_tokens": 10, "max_completion_tokens": 5000},
        {"max_completion_tokens": 5000, "max_tokens": 10},
        {"max_tokens": 5000, "max_completion_tokens": 10},
    ):
        ctx = make_ctx(tenant="demo-free", tier="free")
        r = await TokensPlugin({}, services).request_body(ctx, _chat(**kw))
        assert r is not None
        sent = json.loads(r.body) if r.body is not None else json.loads(_chat(**kw))
        used = _backend_max_tokens(sent)
        assert isinstance(used, int) and used <= 256, (kw, sent)  # the free tier's cap
        assert ctx.reserve is not None and ctx.prompt_tokens is not None
        assert ctx.reserve - ctx.prompt_tokens >= used, (kw, sent)
        assert all(sent[k] <= 256 for k in ("max_tokens", "max_completion_tokens")), sent
