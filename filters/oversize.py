"""A body over its route's limit: read it to its end, discard it, then answer 413.

Envoy streams such a body to us in full-duplex mode (``ext_proc_oversize_per_route``): it keeps
reading from the client and buffers nothing. Answering before the body has arrived would make
Envoy close a connection the client is still writing to, and most clients (the async ``openai``
client among them) then see a reset instead of the answer. Past ``max_bytes`` we answer anyway.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from filters.api import openai_error
from filters.protocol import immediate

__all__ = ["MAX_DRAIN_BYTES", "drain_body", "oversize_limit", "oversize_reply"]

MAX_DRAIN_BYTES = 256 * 1024**2  # beyond this a client gets the 413 and a closed connection


def oversize_limit(route_name: str, prefix: str) -> int | None:
    """The byte limit named by an oversize route name, or None for any other route."""
    if not route_name.startswith(prefix):
        return None
    digits = route_name[len(prefix) :]
    return int(digits) if digits.isdigit() else 0


async def drain_body(
    read: Callable[[], Awaitable[pb.ProcessingRequest]],
    eof: object,
    *,
    max_bytes: int = MAX_DRAIN_BYTES,
) -> int | None:
    """Read the request to its end (or past ``max_bytes``): the body bytes discarded, or None
    when Envoy gave up on the stream first (the client left: nobody to answer)."""
    seen = 0
    while seen <= max_bytes:
        req = await read()
        if req is eof:
            return None
        which = req.WhichOneof("request")
        if which == "request_body":
            seen += len(req.request_body.body)
            if req.request_body.end_of_stream:
                break
        elif which == "request_trailers" or (
            which == "request_headers" and req.request_headers.end_of_stream
        ):
            break
    return seen


def oversize_reply(limit: int) -> pb.ProcessingResponse:
    return immediate(
        openai_error(
            413,
            f"the request body is larger than this route accepts ({limit} bytes)",
            details="tokenweir_too_large",
        )
    )
