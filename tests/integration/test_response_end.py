"""Admission frees its slot at the response's end with no message per chunk (real Envoy).

Envoy ends an ext_proc stream right after the last phase it sends. Admission needs the end of
the response, not its chunks: its routes ask for no response body but for the response
trailers, which keeps the stream open to the response's end (Envoy sends a trailers message
only when the backend sent trailers). Before, the body was STREAMED to the filter server only
to keep the stream open: one gRPC round trip per chunk."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from filters.app import FilterApp, Settings
from runtime.local_http import serve_any_path
from tests.helpers import free_port
from tests.integration.mesh_harness import Mesh, mesh
from tests.integration.test_admission_envoy import KEYS, policy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
CHUNKS, GAP = 6, 0.15


class SlowStream:
    """An SSE backend: CHUNKS events GAP seconds apart (or one JSON answer, or a 503)."""

    def __init__(self) -> None:
        self.port = 0
        self.kind = "sse"
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        self._runner, self.port = await serve_any_path(self._handle, "127.0.0.1")

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if not request.path.startswith("/v1/"):  # the control plane's pool-state scrapes
            return web.Response(status=404)
        if self.kind != "sse":
            await asyncio.sleep(GAP * CHUNKS)
            return web.json_response({"ok": True}, status=200 if self.kind == "json" else 503)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(CHUNKS):
            await resp.write(f'data: {{"i": {i}}}\n\n'.encode())
            await asyncio.sleep(GAP)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@contextlib.asynccontextmanager
async def running(tmp_path: Path) -> AsyncIterator[tuple[str, Mesh, FilterApp, SlowStream]]:
    backend = SlowStream()
    await backend.start()
    gw, fp = free_port(), free_port()
    try:
        async with mesh(tmp_path, policy(gw, fp, backend.port), {"edge": gw}) as m:
            app = FilterApp(Settings(policy_path=m.policy_path), clock=time.monotonic)
            await app.start()
            try:
                yield f"http://127.0.0.1:{gw}", m, app, backend
            finally:
                await app.aclose()
    finally:
        await backend.aclose()


async def _ext_proc_messages(m: Mesh) -> tuple[int, int]:
    _, text = await m.envoys["edge"].admin_get("/stats?filter=ext_proc")
    sent = sum(int(v) for v in re.findall(r"ext_proc\.stream_msgs_sent: (\d+)", text))
    got = sum(int(v) for v in re.findall(r"ext_proc\.stream_msgs_received: (\d+)", text))
    return sent, got


async def test_the_slot_is_held_to_the_response_end_without_a_message_per_chunk(
    tmp_path: Path,
) -> None:
    async with running(tmp_path) as (url, m, app, backend):
        gate = app.gates.gate("chat")
        assert gate is not None
        headers = {"authorization": f"Bearer {KEYS['alice']}", "content-type": "application/json"}
        async with aiohttp.ClientSession() as s:
            for kind in ("sse", "json", "error"):
                backend.kind = kind
                held: list[int] = []
                async with s.post(f"{url}/v1/chat/completions", data=b"{}", headers=headers) as r:
                    async for _ in r.content.iter_any():
                        held.append(gate.core.in_flight)  # while the response is still open
                    status = r.status
                assert status == (503 if kind == "error" else 200), kind
                assert held and all(n == 1 for n in held), (kind, held)
                deadline = time.monotonic() + 5
                while gate.core.in_flight:  # freed at the end (the stream closes after it)
                    assert time.monotonic() < deadline, f"{kind}: the slot was never freed"
                    await asyncio.sleep(0.01)
        sent, got = await _ext_proc_messages(m)
        # one message per request (its headers), answered once: no response chunk went out
        assert (sent, got) == (3, 3), (sent, got)
