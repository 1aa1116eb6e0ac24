"""Output tokens of an answer read chunk by chunk: the SSE usage event (OpenAI) or last
``meta_info`` (SGLang ``/generate``), else the JSON body's ``usage``. Bounded memory: an SSE
stream keeps only its unfinished event, a JSON body at most ``max_json`` bytes."""

from __future__ import annotations

from filters.sse import event_json, split_events, usage_from_json, usage_of

__all__ = ["UsageScan"]


class UsageScan:
    def __init__(self, content_type: str, *, max_json: int = 4 * 1024**2) -> None:
        self.sse = content_type.startswith("text/event-stream")
        self.max_json = max_json
        self._buf = b""
        self.tokens: int | None = None
        self.overflow = False

    def feed(self, chunk: bytes) -> None:
        if not self.sse:
            if len(self._buf) + len(chunk) > self.max_json:
                self.overflow, self._buf = True, b""
            elif not self.overflow:
                self._buf += chunk
            return
        events, self._buf = split_events(self._buf + chunk)
        if len(self._buf) > self.max_json:
            self._buf = b""
        for ev in events:
            if b'"usage"' in ev or b"meta_info" in ev:
                found = usage_of(event_json(ev))
                if found is not None and (self.tokens is None or found.completion_tokens > 0):
                    self.tokens = found.completion_tokens

    def done(self) -> int | None:
        if not self.sse and self._buf:
            found = usage_from_json(self._buf)
            self.tokens = found.completion_tokens if found is not None else None
            self._buf = b""
        return self.tokens
