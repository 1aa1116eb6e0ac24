"""A test plugin standing for a reservation far too low: after the tokens plugin, it gives the
backend the ``max_tokens`` the client asked for (undoing the clamp to the budget) and reserves
the prompt plus ``completion`` tokens (setting, default 8) — any wrong estimate, at its worst.
The in-stream stop must hold the budget anyway (tests/integration/test_stream_stop.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from filters.api import BasePlugin, Context, Result
from filters.bodies import dump_body
from filters.services import Services

__all__ = ["Lowball"]


class Lowball(BasePlugin):
    name = "lowball"

    def __init__(self, settings: Mapping[str, Any], services: Services) -> None:
        self.completion = int(settings.get("completion", 8))

    async def request_body(self, ctx: Context, body: bytes) -> Result | None:
        if ctx.body is None or ctx.prompt_tokens is None:
            return None
        data = json.loads(body)
        asked = ctx.body.max_tokens
        if asked is not None and ctx.body.kind != "generate":
            data["max_tokens"] = asked
            data.pop("max_completion_tokens", None)
            ctx.max_tokens = asked
        ctx.reserve = ctx.prompt_tokens + self.completion
        new = dump_body(data)
        headers = {"x-tokenweir-reserve": str(ctx.reserve), "content-length": str(len(new))}
        return Result(set_headers=headers, body=new, metadata={"reserve": ctx.reserve})
