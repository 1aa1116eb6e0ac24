"""One parse of the request body per request: on a route without the tokens plugin, the prefix
plugin and the picker read the same parse (``filters.bodies.request_of``); on a route with every
built-in plugin that reads the body (idempotency's replay, tokens, lora, pd, collapse, prefix,
picker) the body is decoded once, its rewrites included (``filters.bodies.body_json``)."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from prometheus_client import CollectorRegistry

import filters.bodies
from filters.api import BasePlugin, Context, Result, RouteInfo
from filters.bodies import Decoded, LlmRequest, json_of, request_of
from filters.chain import Chain
from filters.plugins.collapse.hub import Hub
from filters.plugins.collapse.plugin import CollapsePlugin
from filters.plugins.idempotency.plugin import REPLAYED_HEADER, IdempotencyPlugin
from filters.plugins.lora.hub import LoraHub
from filters.plugins.lora.plugin import LoraPlugin
from filters.plugins.pd.hub import Flight, PdHub
from filters.plugins.pd.plugin import PdPlugin
from filters.plugins.picker.plugin import PickerPlugin
from filters.plugins.picker.registry import Pickers
from filters.plugins.prefix.plugin import PrefixPlugin
from filters.plugins.tokens.plugin import TokensPlugin
from filters.services import Services, default_services
from policy import load_policy
from policy.phases import COLLAPSE_TO_HEADER
from policy.routing import ENDPOINT_HEADER
from tests.filters.picker.test_pool import NAMES, Clock, _picker
from wire.jsontypes import JsonObject


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times a body was decoded (its length each time)."""
    seen: list[int] = []
    real = filters.bodies.decode_json

    def counting(body: bytes) -> JsonObject:
        seen.append(len(body))
        return real(body)

    monkeypatch.setattr(filters.bodies, "decode_json", counting)
    return seen


@pytest.fixture
def raw_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every JSON decode by either decoder a plugin could call (``json.loads``,
    ``msgspec.json.decode``): a plugin that decodes the body itself shows here, not in
    ``decodes``."""
    seen: list[int] = []
    loads, decode = json.loads, msgspec.json.decode

    def counting_loads(s: str | bytes, **kw: Any) -> object:
        seen.append(len(s))
        return loads(s, **kw)

    def counting_decode(s: bytes, **kw: Any) -> object:
        seen.append(len(s))
        return decode(s, **kw)

    monkeypatch.setattr(json, "loads", counting_loads)
    monkeypatch.setattr(msgspec.json, "decode", counting_decode)
    return seen


async def test_prefix_and_picker_share_one_parse(services: Services, decodes: list[int]) -> None:
    clock = Clock()
    picker, _ = _picker(clock)
    pickers = Pickers(registry=CollectorRegistry(), clock=clock, wall=clock)
    picker.metrics = pickers.metrics
    pickers._pools["chat"] = (None, picker)
    chain = [
        PrefixPlugin({}, services),
        PickerPlugin({}, SimpleNamespace(pickers=pickers)),  # type: ignore[arg-type]
    ]
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi " * 300}]})
    ctx = Context(
        route=RouteInfo(name="r", pool="chat"),
        started=clock(),
        path="/v1/chat/completions",
        method="POST",
    )
    results = [await p.request_body(ctx, body.encode()) for p in chain]
    assert results[0] is not None and "x-prefix-hash" in results[0].set_headers
    assert results[1] is not None and results[1].metadata["replica"] in NAMES
    assert decodes == [len(body)]  # read once, by the first plugin that needed it
    assert isinstance(ctx.body, LlmRequest) and ctx.body.kind == "chat"


async def test_a_parse_already_on_the_context_is_used(decodes: list[int]) -> None:
    ctx = Context(route=RouteInfo(name="r"), started=0.0, path="/generate")
    first = request_of(ctx, b'{"text": "hello"}')
    assert first is not None and first.kind == "generate"
    assert request_of(ctx, b"not even json") is first
    assert decodes == [17]
    other = Context(route=RouteInfo(name="r"), started=0.0, path="/v1/models")
    assert request_of(other, b"{}") is None and other.body is None


# --- every built-in plugin that reads the body, on one route: one decode per request ---

POOLS = """
version: 1
pools:
  chat:
    models: [m]
    endpoints: [127.0.0.1:7001, 127.0.0.1:7002, 127.0.0.1:7003]
    retries: {enabled: false}
  adapters:
    models: [m]
    endpoints: [10.2.0.1:30000, 10.2.0.2:30000]
    retries: {enabled: false}
    lora: {adapters: [sql]}
  split:
    models: [m]
    retries: {enabled: false}
    disaggregation:
      prefill: [{address: 10.1.0.1:30000, bootstrap_port: 9001}]
      decode: [10.1.0.3:30000]
"""


class _PrefillSink(PdHub):
    """The PD hub, its prefill call kept instead of sent (no network in unit tests)."""

    def send_prefill(self, flight: Flight, path: str, body: bytes, pd: object) -> None:
        self.sent = body


def _all_plugins(tmp_path: Path, clock: Clock) -> tuple[Chain, Services]:
    """A chain of every built-in plugin that reads the request body, in the documented order."""
    path = tmp_path / "pools.yaml"
    path.write_text(POOLS)
    picker, _ = _picker(clock)
    pickers = Pickers(registry=CollectorRegistry(), clock=clock, wall=clock)
    picker.metrics = pickers.metrics
    pickers._pools["chat"] = (None, picker)
    services = replace(
        default_services(load_policy(path), clock),
        pickers=pickers,
        collapser=Hub(clock, address="127.0.0.1:9"),
        pd=_PrefillSink(CollectorRegistry(), clock=clock, rng=random.Random(5)),
        lora=LoraHub(CollectorRegistry(), offline=True),
    )
    plugins = [
        IdempotencyPlugin({}, services),
        TokensPlugin({}, services),
        LoraPlugin({}, services),
        PdPlugin({}, services),
        CollapsePlugin({}, services),
        PrefixPlugin({}, services),
        PickerPlugin({}, services),
    ]
    return Chain("r", plugins), services


class _Probe(BasePlugin):
    """Records the body it is handed and the context's decode at that moment."""

    name = "probe"

    def __init__(self, seen: list[tuple[bytes, Decoded | None]]) -> None:
        self.seen = seen

    async def request_body(self, ctx: Context, body: bytes) -> Result | None:
        self.seen.append((body, ctx.decoded))
        return None


def _ctx(pool: str, clock: Clock, model: str = "m") -> Context:
    route = RouteInfo(name="r", pool=pool, models=("m", "sql") if pool == "adapters" else ("m",))
    return Context(
        route=route,
        started=clock(),
        path="/v1/chat/completions",
        method="POST",
        request_headers={"content-type": "application/json"},
        model=model,
    )


def _chat(model: str = "m", **extra: object) -> bytes:
    msgs = [{"role": "system", "content": "be brief " * 40}, {"role": "user", "content": "hi"}]
    return json.dumps({"model": model, "messages": msgs, "temperature": 0, **extra}).encode()


@pytest.mark.parametrize(
    ("pool", "model", "acts"),
    [
        ("chat", "m", {"collapse", "prefix", "picker"}),
        ("adapters", "sql", {"lora", "collapse", "prefix"}),
        ("split", "m", {"pd", "collapse", "prefix"}),
    ],
)
async def test_every_plugin_reads_the_one_decode(
    tmp_path: Path,
    decodes: list[int],
    raw_decodes: list[int],
    pool: str,
    model: str,
    acts: set[str],
) -> None:
    clock = Clock()
    chain, _ = _all_plugins(tmp_path, clock)
    ctx = _ctx(pool, clock, model)
    await chain.request_headers(ctx, {":method": "POST", "idempotency-key": "k1"}, False)
    body = _chat(model)
    seen: list[tuple[bytes, Decoded | None]] = []
    chain = Chain("r", [*chain.plugins, _Probe(seen)])
    raw_decodes.clear()
    out = await chain.request_body(ctx, body)
    # one decode by any decoder: of the client's body with the rid idempotency spliced in
    # (``{"rid":"…",`` before the client's fields: its one copy of the bytes, no decode)
    assert len(raw_decodes) == 1 and raw_decodes[0] > len(body), (raw_decodes, len(body))
    assert out.reply is None, out.reply
    sent = set(out.set_headers)
    done = {
        "lora": ENDPOINT_HEADER in sent and pool == "adapters",
        "pd": ENDPOINT_HEADER in sent and pool == "split",
        "collapse": COLLAPSE_TO_HEADER in sent,
        "prefix": "x-prefix-hash" in sent,
        "picker": pool == "chat" and ENDPOINT_HEADER in sent,
    }
    assert {k for k, v in done.items() if v} == acts
    assert len(decodes) == 1  # tokens decoded it; the others (and its rewrites) read that
    ((last, kept),) = seen  # what the plugin after them all was handed, and the context's decode
    assert out.body is last and kept is not None and kept.raw is last
    assert msgspec.json.decode(last) == kept.result  # the kept decode is what is sent
    assert ctx.decoded is None  # dropped with the body phase: the bytes are not held to the end


async def test_without_tokens_the_first_reader_decodes_and_a_bad_body_once(
    tmp_path: Path, decodes: list[int], raw_decodes: list[int]
) -> None:
    clock = Clock()
    chain, _ = _all_plugins(tmp_path, clock)
    plugins = tuple(p for p in chain.plugins if p.name != "tokens")
    ctx = _ctx("adapters", clock, "sql")
    raw_decodes.clear()
    out = await Chain("r", plugins).request_body(ctx, _chat("sql"))
    assert out.reply is None and ENDPOINT_HEADER in out.set_headers
    assert len(decodes) == 1 and len(raw_decodes) == 1
    bad = _ctx("chat", clock)
    out = await Chain("r", plugins).request_body(bad, b"{not json")
    assert out.reply is not None and out.reply.status == 400  # prefix's 400, as before
    assert b"not valid JSON" in out.reply.body
    assert len(decodes) == 2  # collapse met it first and let it pass; prefix read its 400


async def test_a_body_rewritten_by_another_plugin_is_decoded_anew(decodes: list[int]) -> None:
    ctx = Context(route=RouteInfo(name="r"), started=0.0, path="/v1/chat/completions")
    first = json_of(ctx, b'{"a": 1}')
    assert first == {"a": 1} and json_of(ctx, b'{"a": 1}') is first  # equal bytes: kept
    assert json_of(ctx, b'{"a": 2}') == {"a": 2}  # a plugin's own rewrite: read again
    assert len(decodes) == 2
    assert json_of(ctx, b"[1]") is None and len(decodes) == 3


async def test_a_replay_reads_the_body_once(tmp_path: Path, decodes: list[int]) -> None:
    clock = Clock()
    chain, _ = _all_plugins(tmp_path, clock)
    stream = _chat(stream=True)
    sse = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1}}\n\n'
    for attempt in range(2):
        ctx = _ctx("chat", clock)
        await chain.request_headers(ctx, {":method": "POST", "idempotency-key": "k2"}, False)
        out = await chain.request_body(ctx, stream)
        if attempt == 0:
            await chain.response_headers(
                ctx, {":status": "200", "content-type": "text/event-stream"}
            )
            await chain.response_chunk(ctx, sse + b"data: [DONE]\n\n", True)
            await chain.stream_end(ctx)
    assert out.reply is not None and out.reply.headers[REPLAYED_HEADER] == "true"
    assert out.reply.body == b"data: [DONE]\n\n"  # the usage event the client did not ask for
    assert len(decodes) == 2  # one per request: the replay read the body once, to decide that
