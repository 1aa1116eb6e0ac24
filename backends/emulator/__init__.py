"""A CPU emulator of an SGLang server: same HTTP API and metric names, a real radix prefix cache,
and a timing model of continuous batching (see docs/emulator.md).

In-process use::

    server = await start_emulator(EmulatorSettings(profile="seed-2k", time_scale=0.01))
    ...  # server.url, server.port
    await server.aclose()
"""

from backends.emulator.app import start_emulator
from backends.emulator.server import EmulatorServer
from backends.emulator.settings import EmulatorSettings

__all__ = ["EmulatorServer", "EmulatorSettings", "start_emulator"]
