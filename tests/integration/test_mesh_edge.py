"""The gateway against untrusted clients: internal headers cannot steer routing, and Envoy's
own error replies are OpenAI-style JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import free_port
from tests.integration.mesh_harness import close_backends, mesh, start_backends

pytestmark = pytest.mark.integration


async def test_client_internal_headers_cannot_pick_a_route(tmp_path: Path) -> None:
    bs = await start_backends(2)
    gw = free_port()
    text = f"""
version: 1
pools:
  vip: {{models: [m], endpoints: [127.0.0.1:{bs[0].port}], health_check: {{enabled: false}}}}
  common: {{models: [m], endpoints: [127.0.0.1:{bs[1].port}], health_check: {{enabled: false}}}}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes:
      - {{name: vip, pool: vip, lane: interactive, match: {{prefix: /, headers: {{x-tokenweir-lane: interactive}}}}}}
      - {{name: common, pool: common}}
"""
    try:
        async with mesh(tmp_path, text, {"edge": gw}) as m:
            status, headers, _ = await m.get(
                gw, "/v1/x", {"x-tokenweir-lane": "interactive", "x-tokenweir-tenant": "t"}
            )
            assert status == 200 and headers["x-backend"] == "b1", "a client header chose the route"
            assert "x-tokenweir-tenant" not in bs[1].seen_headers[-1]
            assert "x-tokenweir-lane" not in bs[1].seen_headers[-1]
            assert bs[0].hits == 0
    finally:
        await close_backends(bs)


async def test_envoy_errors_are_openai_style_json(tmp_path: Path) -> None:
    gw, dead = free_port(), free_port()
    text = f"""
version: 1
pools:
  chat: {{models: [m], endpoints: [127.0.0.1:{dead}], health_check: {{enabled: false}}, retries: {{enabled: false}}}}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes: [{{name: chat, pool: chat, match: {{prefix: /v1/}}}}]
"""
    async with mesh(tmp_path, text, {"edge": gw}) as m:
        status, headers, body = await m.get(gw, "/nowhere")
        assert status == 404 and headers["Content-Type"] == "application/json"
        err = json.loads(body)["error"]
        assert err["code"] == "route_not_found" and err["type"] == "gateway_error"
        assert err["message"] == "no route matches this method, host and path"
        assert "retry-after" not in {k.lower() for k in headers}  # the same request never helps
        status, headers, body = await m.get(gw, "/v1/chat/completions")
        assert status == 503 and headers["Content-Type"] == "application/json"
        err = json.loads(body)["error"]
        assert err["message"] and err["type"] == "gateway_error" and err["code"]
        lower = {k.lower(): v for k, v in headers.items()}
        assert lower.get("retry-after") == "1", (
            headers,
            body,
        )  # a 5xx of Envoy's own: retry shortly
