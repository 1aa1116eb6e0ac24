"""``POST /v1/embeddings`` as SGLang's OpenAI server answers it for an embedding model.

``input`` is a string, a list of strings, a list of token ids, or a list of such lists; each
item is one prefill through the scheduler (SGLang runs an embedding as a prefill: it queues,
batches and is preempted like any request), so its time is the profile's prefill time. The
vector is a deterministic function of the item's token ids (a seeded generator from their
hash, with the served model's name), unit length, of ``--embedding-dim`` floats (``dimensions`` asks for a shorter prefix,
renormalized, as a Matryoshka model gives it). ``encoding_format: base64`` answers the little
endian float32 bytes in base64, as the OpenAI API does (the ``openai`` client asks for it).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import math
import random
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from aiohttp import web

from backends.emulator.protocol import context_check, parse_json_object, parse_priority
from backends.errors import RequestError, SchedulerAbortError
from wire.jsontypes import JsonObject, JsonValue

if TYPE_CHECKING:
    from backends.emulator.server import EmulatorServer

__all__ = ["embedding_vector", "embeddings_routes", "input_items"]

MAX_INPUTS = 2048  # OpenAI's limit on the items of one request


def embeddings_routes(server: EmulatorServer) -> list[web.RouteDef]:
    async def embeddings(request: web.Request) -> web.StreamResponse:
        return web.json_response(await _embed(server, parse_json_object(await request.read())))

    return [web.post("/v1/embeddings", embeddings)]


def _token_ids(value: object) -> list[int] | None:
    if (
        isinstance(value, list)
        and value
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    ):
        return list(value)
    return None


def input_items(value: object, encode: Callable[[str], list[int]]) -> list[list[int]]:
    """Each input item's token ids; 400 on anything else (an empty string or list included)."""
    what = "input must be a non-empty string, a list of strings, or (lists of) token ids"
    if isinstance(value, str):
        value = [value]
    ids = _token_ids(value)
    if ids is not None:
        return [ids]
    if not isinstance(value, list) or not value:
        raise RequestError(what, "input")
    if len(value) > MAX_INPUTS:
        raise RequestError(f"input holds {len(value)} items; at most {MAX_INPUTS}", "input")
    items: list[list[int]] = []
    for i, item in enumerate(value):
        ids = encode(item) if isinstance(item, str) else _token_ids(item)
        if not ids:
            raise RequestError(f"input[{i}]: {what}", "input")
        items.append(ids)
    return items


def embedding_vector(ids: Sequence[int], dim: int, model: str) -> list[float]:
    """The unit vector of ``dim`` floats ``model`` gives these token ids: the same on every
    replica of a pool, as one model's weights give it (not ``--seed``, which differs)."""
    h = hashlib.sha256(model.encode("utf-8", "surrogatepass"))
    h.update(",".join(map(str, ids)).encode())
    digest = h.digest()
    rng = random.Random(digest)
    vec = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]


def _dimensions(body: Mapping[str, object], full: int) -> int:
    value = body.get("dimensions")
    if value is None:
        return full
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= full:
        raise RequestError(f"dimensions must be an integer from 1 to {full}", "dimensions")
    return value


def _encoded(vec: list[float], fmt: str) -> JsonValue:
    if fmt == "float":
        return list(vec)
    return base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode("ascii")


async def _embed(server: EmulatorServer, body: JsonObject) -> JsonObject:
    s = server.settings
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise RequestError("encoding_format must be 'float' or 'base64'", "encoding_format")
    full = _dimensions(body, s.embedding_dim)
    items = input_items(body.get("input"), server.encode_text)
    priority = parse_priority(body)
    params = [
        context_check(
            ids,
            1,  # one prefill: the pooled hidden state is the embedding
            default=1,
            context_length=server.profile.context_length,
            ignore_eos=True,
            stop=frozenset(),
            priority=priority,
        )
        for ids in items
    ]
    rid = body.get("rid")  # SGLang's request id: the one item's, else "<rid>-<index>" each
    if rid is not None and (not isinstance(rid, str) or not rid):
        raise RequestError("rid must be a non-empty string", "rid")
    base = rid or "embd-" + server.next_id()
    rids = [base] if len(params) == 1 else [f"{base}-{i}" for i in range(len(params))]
    reqs = [await server.open_request(p, r) for p, r in zip(params, rids, strict=True)]
    await asyncio.gather(*(server.run_to_end(r) for r in reqs))
    for r in reqs:
        if r.abort_message is not None:
            raise SchedulerAbortError(r.abort_message)
    data: list[JsonValue] = []
    for i, ids in enumerate(items):
        vec = embedding_vector(ids, s.embedding_dim, s.model)[:full]
        if full < s.embedding_dim:
            norm = math.sqrt(sum(v * v for v in vec)) or 1.0
            vec = [v / norm for v in vec]
        data.append({"object": "embedding", "embedding": _encoded(vec, fmt), "index": i})
    tokens = sum(len(ids) for ids in items)
    model = body.get("model") or s.model
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
