"""SGLang's ``/load_lora_adapter`` and ``/unload_lora_adapter`` on the emulator (see :mod:`.lora`).

Request ``{"lora_name", "lora_path", "pinned"}`` (unload: ``{"lora_name"}``); answer 200 on
success, 400 otherwise, both ``{"success", "error_message", "loaded_adapters": {name: path}}``
(SGLang's ``LoadLoRAAdapterReqOutput``).
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from aiohttp import web

from backends.emulator.lora import NOT_ENABLED
from backends.errors import RequestError

if TYPE_CHECKING:
    from backends.emulator.server import EmulatorServer

__all__ = ["lora_routes"]


def _parse_load(raw: bytes, *, need_path: bool) -> tuple[str, str, bool]:
    try:
        body = json.loads(raw or b"{}")
    except json.JSONDecodeError as exc:
        raise RequestError(f"the body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict) or not isinstance(body.get("lora_name"), str):
        raise RequestError("lora_name (a string) is required", "lora_name")
    path = body.get("lora_path")
    if need_path and not isinstance(path, str):
        raise RequestError("lora_path (a string) is required", "lora_path")
    return body["lora_name"], str(path or ""), bool(body.get("pinned", False))


def lora_routes(server: EmulatorServer) -> list[web.RouteDef]:
    """The two endpoints, bound to ``server``'s registry and slots."""
    registry, slots = server.lora_registry, server.lora_slots

    def answer(ok: bool, error: str | None) -> web.Response:
        body = {"success": ok, "error_message": error, "loaded_adapters": registry.loaded()}
        return web.json_response(body, status=200 if ok else 400)

    def not_enabled() -> web.Response:
        return answer(False, NOT_ENABLED)

    async def load(request: web.Request) -> web.StreamResponse:
        if not registry.config.enabled:
            return not_enabled()
        name, path, pinned = _parse_load(await request.read(), need_path=True)
        await asyncio.sleep(registry.config.register_s * server.settings.time_scale)
        try:
            registry.load(name, path, pinned)
        except ValueError as exc:
            return answer(False, str(exc))
        return answer(True, None)

    async def unload(request: web.Request) -> web.StreamResponse:
        if not registry.config.enabled:
            return not_enabled()
        name, _, _ = _parse_load(await request.read(), need_path=False)
        try:
            registry.unload(name)
        except ValueError as exc:
            return answer(False, str(exc))
        slots.drop(name)
        return answer(True, None)

    return [web.post("/load_lora_adapter", load), web.post("/unload_lora_adapter", unload)]
