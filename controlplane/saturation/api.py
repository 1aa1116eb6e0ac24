"""``GET /api/v1/pools``: the pool state as JSON, on the control plane's metrics address.

``?after_version=N`` long-polls: the answer comes as soon as a state newer than ``N`` exists, or
after ``timeout`` seconds (default 10, at most 60) with the current state (same version).
Every answer is 200 with the documented JSON (docs/operations.md, "Saturation signal"); bad
query values are 400 with an OpenAI-style error body. The dashboard reads the same API.
"""

from __future__ import annotations

import json

from aiohttp import web

from controlplane.saturation.scraper import PoolScraper
from poolstate.reader import POOLS_PATH

__all__ = ["POOLS_PATH", "pool_routes"]

_MAX_WAIT_S = 60.0


def _bad(message: str) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": 400}}
    return web.json_response(body, status=400)


def pool_routes(scraper: PoolScraper) -> list[web.RouteDef]:
    async def pools(request: web.Request) -> web.Response:
        q = request.query
        try:
            after = int(q["after_version"]) if "after_version" in q else None
            wait = float(q.get("timeout", "10"))
        except ValueError:
            return _bad("after_version must be an integer and timeout a number of seconds")
        if not 0 <= wait <= _MAX_WAIT_S:
            return _bad(f"timeout must be within 0..{_MAX_WAIT_S:g} seconds")
        state = scraper.state if after is None else await scraper.wait_newer(after, wait)
        return web.Response(
            text=json.dumps(state.to_json(), separators=(",", ":")),
            content_type="application/json",
            headers={"Cache-Control": "no-store"},
        )

    return [web.get(POOLS_PATH, pools)]
