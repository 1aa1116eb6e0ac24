"""Fault injection (runtime endpoint and flags), and the emulator as its own process."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from backends.emulator import EmulatorServer, EmulatorSettings, start_emulator
from tests.helpers import ChildProcess, free_port, wait_for_port

pytestmark = pytest.mark.integration

BODY = {"text": "f g h", "sampling_params": {"max_new_tokens": 5}}


@pytest.fixture
async def emu() -> AsyncIterator[EmulatorServer]:
    server = await start_emulator(EmulatorSettings(profile="seed-2k", time_scale=0.05))
    yield server
    await server.aclose()


async def _post_faults(
    http: aiohttp.ClientSession, url: str, body: object
) -> aiohttp.ClientResponse:
    async with http.post(url + "/_emulator/faults", json=body) as r:
        await r.read()
        return r


async def test_error_rate_fault_answers_500_then_recovers(emu: EmulatorServer) -> None:
    async with aiohttp.ClientSession() as http:
        r = await _post_faults(http, emu.url, {"error_rate": 1.0})
        assert r.status == 200
        async with http.post(emu.url + "/generate", json=BODY) as g:
            assert g.status == 500
            assert (await g.json())["object"] == "error"
        async with http.get(emu.url + "/_emulator/faults") as f:
            assert (await f.json())["error_rate"] == 1.0
        await _post_faults(http, emu.url, {"error_rate": 0})
        async with http.post(emu.url + "/generate", json=BODY) as g:
            assert g.status == 200
        assert (await _post_faults(http, emu.url, {"error_rate": 7})).status == 400


async def test_hang_fault_never_answers_and_health_generate_hangs(emu: EmulatorServer) -> None:
    async with aiohttp.ClientSession() as http:
        await _post_faults(http, emu.url, {"hang": True})
        with pytest.raises(asyncio.TimeoutError):
            async with http.post(
                emu.url + "/generate", json=BODY, timeout=aiohttp.ClientTimeout(total=0.5)
            ):
                pass
        with pytest.raises(asyncio.TimeoutError):
            async with http.get(
                emu.url + "/health_generate", timeout=aiohttp.ClientTimeout(total=0.5)
            ):
                pass
        async with http.get(emu.url + "/health") as h:
            assert h.status == 200  # the process is alive; only generation is stuck
        await _post_faults(http, emu.url, {"hang": False})
        async with http.post(emu.url + "/generate", json=BODY) as g:
            assert g.status == 200


async def test_slow_fault_stretches_latency(emu: EmulatorServer) -> None:
    body = {"text": "f g h", "sampling_params": {"max_new_tokens": 40}}
    async with aiohttp.ClientSession() as http:
        fast = float("inf")
        for _ in range(3):  # the quickest of three: a loaded box only ever adds time
            async with http.post(emu.url + "/generate", json=body) as g:
                fast = min(fast, (await g.json())["meta_info"]["e2e_latency"])
        await _post_faults(http, emu.url, {"slow": 4})
        async with http.post(emu.url + "/generate", json=body) as g:
            slow = (await g.json())["meta_info"]["e2e_latency"]
    assert slow > 2.5 * fast


async def test_slow_start_flag_and_fault_make_the_server_unavailable() -> None:
    server = await start_emulator(
        EmulatorSettings(profile="seed-2k", time_scale=0.05, slow_start_s=0.4)
    )
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(server.url + "/health") as h:
                assert h.status == 503
            async with http.post(server.url + "/generate", json=BODY) as g:
                assert g.status == 503
            await asyncio.sleep(0.5)
            async with http.get(server.url + "/health") as h:
                assert h.status == 200
            await _post_faults(http, server.url, {"slow_start_s": 30})
            async with http.get(server.url + "/health") as h:
                assert h.status == 503
    finally:
        await server.aclose()


async def test_crash_fault_in_process_stops_serving_and_aborts_streams() -> None:
    server = await start_emulator(EmulatorSettings(profile="seed-2k", time_scale=1.0))
    try:
        async with aiohttp.ClientSession() as http:
            body = {"text": "x", "sampling_params": {"max_new_tokens": 10_000}, "stream": True}
            async with http.post(server.url + "/generate", json=body) as g:
                await g.content.readline()
                await _post_faults(http, server.url, {"crash": True})
                with pytest.raises(aiohttp.ClientError):
                    async for _ in g.content:
                        pass
            with pytest.raises(aiohttp.ClientConnectionError):
                async with http.get(server.url + "/health"):
                    pass
        assert server.crashed
    finally:
        await server.aclose()


def _spawn(tmp_path: Path, *extra: str) -> tuple[ChildProcess, int]:
    port = free_port()
    argv = [sys.executable, "-m", "backends.emulator", "--port", str(port), "--profile", "seed-2k"]
    child = ChildProcess([*argv, "--time-scale", "0.05", *extra], log=tmp_path / "emu.log")
    wait_for_port(port, timeout=20)
    return child, port


async def test_process_serves_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    child, port = _spawn(tmp_path)
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"http://127.0.0.1:{port}/generate", json=BODY) as g,
        ):
            assert g.status == 200
        child.proc.send_signal(signal.SIGTERM)
        assert child.proc.wait(10) == 0
        assert "emulator stopping" in child.output()
    finally:
        child.close()


async def test_process_crash_fault_exits(tmp_path: Path) -> None:
    child, port = _spawn(tmp_path)
    try:
        async with aiohttp.ClientSession() as http:
            await _post_faults(http, f"http://127.0.0.1:{port}", {"crash": True})
        deadline = time.monotonic() + 10
        while child.alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert child.proc.returncode == 70
    finally:
        child.close()
