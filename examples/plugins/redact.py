"""A worked example plugin: redact e-mail addresses from prompts, refuse blocked words.

Use it on a route by import path (the repository root must be importable, or install your
package)::

    filters:
      plugins:
        - identity
        - name: examples.plugins.redact:RedactPlugin
          settings: {block_words: [password], placeholder: "[email]"}
        - tokens
        - usage

Put it before ``tokens`` so the token estimate sees the redacted text. See docs/plugins.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from filters.api import BasePlugin, Context, Result, Slot
from filters.errors import ClientError, ConfigError

__all__ = ["RedactPlugin"]

REDACTED: Slot[int] = Slot("redact.count")  # this request's addresses replaced (per-request state)
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+")


class RedactPlugin(BasePlugin):
    name = "redact"

    def __init__(self, settings: Mapping[str, Any], services: Any) -> None:
        unknown = set(settings) - {"block_words", "placeholder"}
        if unknown:
            raise ConfigError(f"redact: unknown setting(s) {sorted(unknown)}")
        self.block = tuple(str(w).lower() for w in settings.get("block_words", ()))
        self.placeholder = str(settings.get("placeholder", "[email]"))

    async def request_body(self, ctx: Context, body: bytes) -> Result | None:
        try:
            data = json.loads(body)
        except ValueError:
            return None  # the tokens plugin answers malformed bodies
        messages = data.get("messages") if isinstance(data, dict) else None
        if not isinstance(messages, list):
            return None
        count = 0
        for msg in messages:
            if isinstance(msg, dict) and isinstance(msg.get("content"), str):
                text = msg["content"]
                lowered = text.lower()
                for word in self.block:
                    if word in lowered:
                        raise ClientError(
                            400, f"the prompt contains a blocked word ({word!r})", reason="blocked"
                        )
                msg["content"], n = _EMAIL.subn(self.placeholder, text)
                count += n
        ctx.put(REDACTED, count)
        if count == 0:
            return None
        new = json.dumps(data).encode()
        return Result(body=new, set_headers={"content-length": str(len(new))})

    async def response_chunk(
        self, ctx: Context, chunk: bytes, end_of_stream: bool
    ) -> Result | None:
        return None  # nothing to do on the way back; shown so the hook's shape is visible
