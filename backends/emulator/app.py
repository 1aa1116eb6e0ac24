"""An emulator with its HTTP APIs: the server (:mod:`.server`) serves what it is handed, the
APIs (:mod:`.openai_api`, :mod:`.native_api`) read the server; this module puts them together,
so neither side imports the other."""

from __future__ import annotations

from aiohttp import web

from backends.emulator import lora_api, native_api, openai_api
from backends.emulator.embeddings_api import embeddings_routes
from backends.emulator.flavor import VLLM_NATIVE_PATHS
from backends.emulator.server import Api, EmulatorServer
from backends.emulator.settings import EmulatorSettings

__all__ = ["APIS", "apis_for", "start_emulator"]

APIS: tuple[Api, ...] = (
    openai_api.routes,
    embeddings_routes,
    native_api.routes,
    lora_api.lora_routes,
)


def _vllm_native(server: EmulatorServer) -> list[web.RouteDef]:
    """The native routes a vLLM server also has (the rest answer 404), and the emulator's own."""
    routes = native_api.routes(server)
    return [r for r in routes if r.path in VLLM_NATIVE_PATHS or r.path.startswith("/_emulator/")]


def apis_for(flavor: str) -> tuple[Api, ...]:
    """The HTTP APIs an emulator of ``flavor`` serves."""
    return (openai_api.routes, embeddings_routes, _vllm_native) if flavor == "vllm" else APIS


async def start_emulator(settings: EmulatorSettings) -> EmulatorServer:
    """Start an emulator in this event loop; it serves until ``aclose()``."""
    server = EmulatorServer(settings, apis=apis_for(settings.flavor))
    try:
        await server.start()
    except BaseException:
        await server.aclose()
        raise
    return server
