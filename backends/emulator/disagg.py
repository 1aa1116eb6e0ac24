"""Prefill/decode disaggregation (SGLang's ``--disaggregation-mode prefill|decode``).

The protocol, as SGLang runs it (read from its source: ``srt/disaggregation/``, the router's PD
mode and ``mini_lb.py``; not checked against a GPU deployment):

1. A router picks one prefill and one decode server, adds ``bootstrap_host`` (the prefill's
   host), ``bootstrap_port`` (the prefill's ``--disaggregation-bootstrap-port``) and a random
   ``bootstrap_room`` (0..2**63-1) to the body, and sends the same body to both at once.
2. The prefill server holds the request in its bootstrap queue until the decode server has
   connected for that room; it then computes the prompt (its own scheduler, radix cache and KV
   events), samples the first token, and pushes the KV to the decode server.
3. The decode server connects to the prefill's bootstrap server, waits for the KV, then decodes;
   its answer is the one the client gets. A failed side fails the other (decode answers 500).

The emulator keeps that shape with its own hand-over in place of RDMA: the prefill server runs a
small bootstrap HTTP server (``POST /_emulator/kv/{room}``: the decode's long poll, answered when
the KV has arrived or the prefill failed), and the transfer takes ``prompt tokens x
kv_bytes_per_token / link bandwidth`` (times ``--time-scale``). A request with no bootstrap
fields is served whole, as SGLang serves its own warm-up and health requests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp
from aiohttp import web

from backends.emulator.disagg_config import (
    DEFAULT_BOOTSTRAP_PORT,
    DEFAULT_KV_BYTES_PER_TOKEN,
    MODES,
    DisaggConfig,
)
from backends.emulator.request import EmuRequest, GenerationParams
from backends.errors import KvTransferError, RequestError
from wire.jsontypes import JsonObject


class _Scheduler(Protocol):
    def abort(self, req: EmuRequest) -> None: ...


class _Settings(Protocol):
    @property
    def time_scale(self) -> float: ...


class _Profile(Protocol):
    @property
    def page_size(self) -> int: ...


class EmulatorServer(Protocol):
    """What the PD sides use of :class:`backends.emulator.server.EmulatorServer` (a protocol, so
    this module does not import the server that imports it)."""

    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def scheduler(self) -> _Scheduler: ...
    @property
    def settings(self) -> _Settings: ...
    @property
    def profile(self) -> _Profile: ...

    def spawn(self, coro: Awaitable[object]) -> None: ...


__all__ = [
    "DEFAULT_BOOTSTRAP_PORT",
    "Bootstrap",
    "DecodeSide",
    "DisaggConfig",
    "OpenFn",
    "PrefillSide",
    "RoomTable",
    "add_disagg_args",
    "disagg_config",
    "parse_bootstrap",
    "transfer_seconds",
]

log = logging.getLogger("backends.emulator")

_ROOM_MAX = 2**64 - 1

# (params, rid, http request, the KV came from a prefill server) -> the admitted request
OpenFn = Callable[[GenerationParams, str, web.Request | None, bool], Awaitable[EmuRequest]]


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """The three fields a PD router adds to a request body."""

    host: str
    port: int
    room: int


def parse_bootstrap(body: Mapping[str, object]) -> Bootstrap | None:
    """The body's bootstrap fields (None when it has no ``bootstrap_room``); RequestError when
    they are malformed. A missing ``bootstrap_port`` means SGLang's default port."""
    room = body.get("bootstrap_room")
    if room is None:
        return None
    if isinstance(room, bool) or not isinstance(room, int) or not 0 <= room <= _ROOM_MAX:
        raise RequestError("bootstrap_room must be an integer in [0, 2**64)", "bootstrap_room")
    host = body.get("bootstrap_host")
    if not isinstance(host, str) or not host:
        raise RequestError("bootstrap_host must be the prefill server's host", "bootstrap_host")
    port = body.get("bootstrap_port")
    if port is None:
        port = DEFAULT_BOOTSTRAP_PORT
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port <= 65535:
        raise RequestError("bootstrap_port must be a port number or null", "bootstrap_port")
    return Bootstrap(host=host.strip("[]"), port=port, room=room)


def transfer_seconds(tokens: int, config: DisaggConfig) -> float:
    """Emulated time (before ``--time-scale``) to move ``tokens`` tokens of KV over the link."""
    return tokens * config.kv_bytes_per_token / (config.link_gb_per_s * 1e9)


@dataclass(eq=False, slots=True)
class _Room:
    """One request's rendezvous on the prefill server."""

    expires_at: float
    decode_here: asyncio.Event = field(default_factory=asyncio.Event)
    decode_gone: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    failed: str | None = None
    result: JsonObject = field(default_factory=dict)

    def fail(self, message: str) -> None:
        if not self.done.is_set():
            self.failed = message
            self.done.set()

    def succeed(self, result: JsonObject) -> None:
        if not self.done.is_set():
            self.result = result
            self.done.set()


class RoomTable:
    """Rooms by id; a room lives until both sides are done or its deadline passes."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl_s
        self._clock = clock
        self._rooms: dict[int, _Room] = {}

    def get(self, room: int) -> _Room:
        now = self._clock()
        if len(self._rooms) > 64:
            self._rooms = {k: r for k, r in self._rooms.items() if r.expires_at > now}
        found = self._rooms.get(room)
        if found is None:
            found = self._rooms[room] = _Room(expires_at=now + 2 * self._ttl)
        return found

    def drop(self, room: int) -> None:
        self._rooms.pop(room, None)

    def __len__(self) -> int:
        return len(self._rooms)


class _Side:
    """What both sides keep for ``/_emulator/state``: transfer counts, the rooms last seen."""

    def __init__(self, config: DisaggConfig) -> None:
        self.config = config
        self.transfers = {"ok": 0, "failed": 0}
        self.recent: deque[JsonObject] = deque(maxlen=256)

    def seen(self, boot: Bootstrap) -> None:
        self.recent.append({"host": boot.host, "port": boot.port, "room": boot.room})

    def state(self) -> JsonObject:
        return {
            "mode": self.config.mode,
            "transfers": dict(self.transfers),
            "recent_rooms": list(self.recent),
        }


class PrefillSide(_Side):
    """A prefill server: its bootstrap server, and each request's wait for its decode side."""

    def __init__(self, server: EmulatorServer, config: DisaggConfig) -> None:
        super().__init__(config)
        self.server = server
        self.rooms = RoomTable(config.timeout_s, server.clock)
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self, host: str) -> None:
        app = web.Application()
        app.add_routes(
            [
                web.get("/health", self._health),
                web.get("/route", self._route),
                web.post("/_emulator/kv/{room}", self._kv),
            ]
        )
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, self.config.bootstrap_port, backlog=1024).start()
        self.port = int(self._runner.addresses[0][1])

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def open(
        self, open_fn: OpenFn, params: GenerationParams, rid: str, http: web.Request | None,
        boot: Bootstrap,
    ) -> EmuRequest:  # fmt: skip
        """Wait for the decode side, then prefill (one output token); a failure here fails
        the room, so the decode side answers at once instead of at its timeout."""
        self.seen(boot)
        room = self.rooms.get(boot.room)
        try:
            try:
                await asyncio.wait_for(room.decode_here.wait(), self.config.timeout_s)
            except TimeoutError:
                raise KvTransferError(
                    f"no decode server joined bootstrap room {boot.room} "
                    f"within {self.config.timeout_s:g} s"
                ) from None
            req = await open_fn(dataclasses.replace(params, max_new_tokens=1), rid, http, False)
        except BaseException as exc:
            room.fail(f"prefill failed: {exc}" if str(exc) else "prefill was cancelled")
            self.transfers["failed"] += 1
            raise
        self.server.spawn(self._send_kv(req, room, boot.room))
        return req

    async def _send_kv(self, req: EmuRequest, room: _Room, room_id: int) -> None:
        """After the prompt is computed, push its KV (link time) and tell the decode side."""
        gone = asyncio.ensure_future(room.decode_gone.wait())
        try:
            finished = asyncio.ensure_future(req.wait_done())
            await asyncio.wait({finished, gone}, return_when=asyncio.FIRST_COMPLETED)
            finished.cancel()
            if not req.done:  # the decode side left: stop computing for nobody
                self.server.scheduler.abort(req)
                room.fail("the decode server left")
            elif req.finish_reason == "abort":
                room.fail(f"prefill aborted: {req.abort_message or 'request aborted'}")
            else:
                delay = (
                    transfer_seconds(req.prompt_len, self.config) * self.server.settings.time_scale
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(gone, delay)
                room.succeed(
                    {"status": "success", "prompt_tokens": req.prompt_len,
                     "cached_tokens": req.cached_tokens,
                     "kv_bytes": req.prompt_len * self.config.kv_bytes_per_token,
                     "first_token": req.output_ids[0] if req.output_ids else None}
                )  # fmt: skip
        finally:
            gone.cancel()
            self.transfers["ok" if room.failed is None and room.done.is_set() else "failed"] += 1
            if room.failed is not None:
                log.info("bootstrap room %d: %s", room_id, room.failed)

    # ---- the bootstrap server -----------------------------------------------------------
    async def _health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="OK")

    async def _route(self, request: web.Request) -> web.StreamResponse:
        """SGLang's ``GET /route`` answers the prefill's parallel layout (one rank here)."""
        return web.json_response(
            {"prefill_attn_tp_size": 1, "prefill_dp_size": 1, "prefill_pp_size": 1,
             "prefill_page_size": self.server.profile.page_size}
        )  # fmt: skip

    async def _kv(self, request: web.Request) -> web.StreamResponse:
        """The decode side joins a room and waits for its KV (or the prefill's failure)."""
        try:
            room_id = int(request.match_info["room"])
        except ValueError:
            return web.json_response({"status": "failed", "message": "bad room"}, status=400)
        room = self.rooms.get(room_id)
        room.decode_here.set()
        try:
            await asyncio.wait_for(room.done.wait(), 2 * self.config.timeout_s)
        except TimeoutError:
            room.fail(f"the prefill did not finish within {2 * self.config.timeout_s:g} s")
        finally:
            if not room.done.is_set():  # the decode side hung up (its client left)
                room.decode_gone.set()
            self.rooms.drop(room_id)
        if room.failed is not None:
            return web.json_response({"status": "failed", "message": room.failed}, status=500)
        return web.json_response(room.result)


class DecodeSide(_Side):
    """A decode server: fetch each request's KV from its prefill server, then decode."""

    def __init__(self, server: EmulatorServer, config: DisaggConfig) -> None:
        super().__init__(config)
        self.server = server
        self.port = 0
        self._session: aiohttp.ClientSession | None = None

    async def start(self, host: str) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=3 * self.config.timeout_s, connect=5.0)
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def open(
        self, open_fn: OpenFn, params: GenerationParams, rid: str, http: web.Request | None,
        boot: Bootstrap,
    ) -> EmuRequest:  # fmt: skip
        if self._session is None:
            raise KvTransferError("the decode server is not started")
        self.seen(boot)
        where = f"{boot.host}:{boot.port}"
        url = f"http://{where}/_emulator/kv/{boot.room}"
        try:
            async with self._session.post(url) as resp:
                data = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self.transfers["failed"] += 1
            raise KvTransferError(
                f"KV transfer from prefill {where} (room {boot.room}) failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if resp.status != 200 or not isinstance(data, dict) or data.get("status") != "success":
            self.transfers["failed"] += 1
            message = data.get("message") if isinstance(data, dict) else None
            raise KvTransferError(
                f"KV transfer from prefill {where} (room {boot.room}) failed: {message}"
            )
        self.transfers["ok"] += 1
        return await open_fn(params, rid, http, True)


def add_disagg_args(parser: argparse.ArgumentParser) -> None:
    """SGLang's ``--disaggregation-*`` flags, and the emulator's link model."""
    g = parser.add_argument_group("PD disaggregation (SGLang's flags; docs/emulator.md)")
    g.add_argument("--disaggregation-mode", choices=MODES, default="null")
    g.add_argument(
        "--disaggregation-bootstrap-port", type=int, default=DEFAULT_BOOTSTRAP_PORT,
        help="prefill: the bootstrap server's port (0: a free one, shown in /get_server_info)",
    )  # fmt: skip
    g.add_argument(
        "--disaggregation-transfer-backend", default="fake",
        help="accepted (mooncake, nixl, ...); the emulator moves KV over its own HTTP hand-over",
    )  # fmt: skip
    g.add_argument("--disaggregation-ib-device", help="ignored")
    g.add_argument(
        "--disaggregation-link-gb-per-s", type=float, default=25.0,
        help="emulator: KV link bandwidth in GB/s (transfer time = prompt KV bytes / this)",
    )  # fmt: skip
    g.add_argument(
        "--disaggregation-kv-bytes-per-token", type=int, default=DEFAULT_KV_BYTES_PER_TOKEN,
        help="emulator: KV bytes per token (default: Llama-3.1-8B bf16, 128 KiB)",
    )  # fmt: skip
    g.add_argument(
        "--disaggregation-timeout", type=float, default=30.0,
        help="emulator: seconds one side waits for the other before failing the request",
    )  # fmt: skip


def disagg_config(args: argparse.Namespace) -> DisaggConfig:
    """The config from ``add_disagg_args``' flags (ValueError when out of range)."""
    return DisaggConfig(
        mode=args.disaggregation_mode,
        bootstrap_port=args.disaggregation_bootstrap_port,
        link_gb_per_s=args.disaggregation_link_gb_per_s,
        kv_bytes_per_token=args.disaggregation_kv_bytes_per_token,
        timeout_s=args.disaggregation_timeout,
    )
