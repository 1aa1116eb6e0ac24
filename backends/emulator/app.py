"""An emulator with its HTTP APIs: the server (:mod:`.server`) serves what it is handed, the
APIs (:mod:`.openai_api`, :mod:`.native_api`) read the server; this module puts them together,
so neither side imports the other."""

from __future__ import annotations

from backends.emulator import native_api, openai_api
from backends.emulator.server import Api, EmulatorServer
from backends.emulator.settings import EmulatorSettings

__all__ = ["APIS", "start_emulator"]

APIS: tuple[Api, ...] = (openai_api.routes, native_api.routes)


async def start_emulator(settings: EmulatorSettings) -> EmulatorServer:
    """Start an emulator in this event loop; it serves until ``aclose()``."""
    server = EmulatorServer(settings, apis=APIS)
    try:
        await server.start()
    except BaseException:
        await server.aclose()
        raise
    return server
