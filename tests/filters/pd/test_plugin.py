"""The pd plugin on a fake prefill server (aiohttp on a loopback port is an integration
matter: here the hub's call is replaced by a recording stand-in)."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from filters.api import Context, RouteInfo
from filters.plugins.pd.hub import Flight, PdHub
from filters.plugins.pd.plugin import PdPlugin
from filters.services import default_services
from policy import load_policy
from policy.routing import ENDPOINT_HEADER

POLICY = """
version: 1
pools:
  chat:
    models: [m1]
    retries: {enabled: false}
    disaggregation:
      prefill: [{address: 10.1.0.1:30000, bootstrap_port: 9001}, {address: 10.1.0.2:30000}]
      decode: [10.1.0.3:30000]
  plain:
    models: [m2]
    endpoints: [10.1.0.9:30000]
"""


class RecordingHub(PdHub):
    def __init__(self) -> None:
        super().__init__(CollectorRegistry(), clock=time.monotonic, rng=random.Random(5))
        self.sent: list[tuple[Flight, str, bytes]] = []

    def send_prefill(self, flight: Flight, path: str, body: bytes, pd: Any) -> None:
        self.sent.append((flight, path, body))


def _plugin(tmp_path: Path) -> tuple[PdPlugin, RecordingHub]:
    path = tmp_path / "mesh.yaml"
    path.write_text(POLICY)
    services = default_services(load_policy(path), time.monotonic)
    hub = RecordingHub()
    object.__setattr__(services, "pd", hub)
    return PdPlugin({}, services), hub


async def test_bootstrap_fields_go_to_both_sides(tmp_path: Path) -> None:
    plugin, hub = _plugin(tmp_path)
    ctx = Context(route=RouteInfo(name="r", pool="chat"), started=0.0, path="/generate?x=1")
    body = json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 4}}).encode()
    result = await plugin.request_body(ctx, body)
    assert result is not None and result.body is not None
    sent = json.loads(result.body)
    (flight, path, prefill_body) = hub.sent[0]
    assert prefill_body == result.body and path == "/generate"
    assert sent["text"] == "hello"
    host = flight.prefill.rsplit(":", 1)[0]
    assert sent["bootstrap_host"] == host
    assert sent["bootstrap_port"] == (9001 if flight.prefill == "10.1.0.1:30000" else 8998)
    assert sent["bootstrap_room"] == flight.room
    assert result.set_headers[ENDPOINT_HEADER] == "10.1.0.3:30000"
    assert result.set_headers["content-length"] == str(len(result.body))
    await plugin.response_headers(ctx, {":status": "200"})
    await plugin.stream_end(ctx)
    assert hub.decode_requests == {"10.1.0.3:30000": 0}


async def test_other_pools_and_non_json_are_left_alone(tmp_path: Path) -> None:
    plugin, hub = _plugin(tmp_path)
    plain = Context(route=RouteInfo(name="r", pool="plain"), started=0.0, path="/generate")
    assert await plugin.request_body(plain, b'{"text": "x"}') is None
    chat = Context(route=RouteInfo(name="r", pool="chat"), started=0.0, path="/generate")
    assert await plugin.request_body(chat, b"not json") is None
    assert hub.sent == []
