"""One parse of the request body per request: on a route without the tokens plugin, the prefix
plugin and the picker read the same parse (``filters.bodies.request_of``)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

import filters.bodies
from filters.api import Context, RouteInfo
from filters.bodies import LlmRequest, request_of
from filters.plugins.picker.plugin import PickerPlugin
from filters.plugins.picker.registry import Pickers
from filters.plugins.prefix.plugin import PrefixPlugin
from filters.services import Services
from tests.filters.picker.test_pool import NAMES, Clock, _picker


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times a body was decoded (its length each time)."""
    seen: list[int] = []
    real = filters.bodies.decode_json

    def counting(body: bytes) -> dict[str, Any]:
        seen.append(len(body))
        return real(body)

    monkeypatch.setattr(filters.bodies, "decode_json", counting)
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
