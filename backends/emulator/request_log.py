"""A line of JSON per finished request (``--request-log PATH``): what the server did with it.

For benchmarks that must split a client's latency into the backend's share and the rest (the
gateway's queueing, CPU and hops): the line names the request by the ``id`` its answer carried
(``chatcmpl-…`` / ``cmpl-…``, SGLang's ``rid``), so a client that kept the ids joins its own
timings with the server's. Times are the scheduler's, in seconds from the request's arrival at
the server: ``queue_s`` until it was admitted to a batch, ``ttft_s`` until its first output
token, ``e2e_s`` until it finished (``null`` for a stage never reached: an abort).
SGLang writes no such file (its ``--log-requests`` logs text); this is the emulator's own.
"""

from __future__ import annotations

import json
from typing import IO

from backends.emulator.observer import SchedulerObserver
from backends.emulator.request import EmuRequest

__all__ = ["RequestLog"]


class RequestLog:
    """A :class:`SchedulerObserver` that forwards every event to ``inner`` and writes a line per
    finished request to ``path`` (appended, line-buffered: a
    killed emulator loses no finished request's line)."""

    def __init__(self, inner: SchedulerObserver, path: str) -> None:
        self._inner = inner
        self._file: IO[str] | None = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    def on_admit(self, req: EmuRequest, queue_time_s: float) -> None:
        self._inner.on_admit(req, queue_time_s)

    def on_first_token(self, req: EmuRequest, ttft_s: float) -> None:
        self._inner.on_first_token(req, ttft_s)

    def on_decode(self, tokens: int, itls_s: list[float]) -> None:
        self._inner.on_decode(tokens, itls_s)

    def on_finish(self, req: EmuRequest, e2e_s: float) -> None:
        self._inner.on_finish(req, e2e_s)
        if self._file is None:
            return

        def since(t: float | None) -> float | None:
            return None if t is None else round(t - req.arrival, 6)

        line = {
            "rid": req.rid,
            "queue_s": since(req.admitted_at),
            "ttft_s": since(req.first_token_at),
            "e2e_s": round(e2e_s, 6),
            "prompt_tokens": req.prompt_len,
            "cached_tokens": req.cached_tokens,
            "output_tokens": len(req.output_ids),
            "finish": req.finish_reason,
        }
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
