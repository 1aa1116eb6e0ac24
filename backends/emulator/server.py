"""The emulator's HTTP server: aiohttp app, request admission (faults, queue), lifecycle.

Errors become HTTP answers in one place (``_map_errors``): ``RequestError`` → 400,
``SchedulerAbortError`` (the queue is full, ...) and ``ServerClosingError`` → 503, ``InjectedFaultError`` → 500, each with
SGLang's error object.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeAlias

from aiohttp import web

from backends.emulator.disagg import Bootstrap, DecodeSide, PrefillSide
from backends.emulator.faults import FaultConfig, decide
from backends.emulator.flavor import VllmEventEncoder, VllmMetrics
from backends.emulator.kv_events import KvEventPublisher
from backends.emulator.lora import NOT_ENABLED, LoraRegistry, LoraSlots, adapter_of
from backends.emulator.lora_metrics import register_lora_metrics
from backends.emulator.metrics import EmulatorMetrics
from backends.emulator.protocol import error_body
from backends.emulator.request import EmuRequest, GenerationParams
from backends.emulator.request_log import RequestLog
from backends.emulator.scheduler import Scheduler
from backends.emulator.settings import EmulatorSettings
from backends.emulator.shapes import DisaggInfo
from backends.emulator.tokenizer import encode, render_chat
from backends.emulator.tracing import end_request_span, start_request_span
from backends.errors import (
    InjectedFaultError,
    KvTransferError,
    RequestError,
    SchedulerAbortError,
    ServerClosingError,
)
from chat.tokenizer import ChatTemplateError, HfChatTokenizer
from runtime.tracing import Tracing

__all__ = ["Api", "EmulatorServer"]

log = logging.getLogger("backends.emulator")
# one HTTP API: its routes, bound to the server (openai_api.routes, native_api.routes)
Api: TypeAlias = Callable[["EmulatorServer"], list[web.RouteDef]]

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _map_errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RequestError as exc:
        return web.json_response(error_body(400, exc.message, exc.param), status=400)
    except (SchedulerAbortError, ServerClosingError) as exc:
        return web.json_response(error_body(503, str(exc)), status=503)
    except (InjectedFaultError, KvTransferError) as exc:
        return web.json_response(error_body(500, str(exc)), status=500)


class EmulatorServer:
    """One emulated SGLang server. Build with :func:`backends.emulator.app.start_emulator`
    (which hands it the HTTP APIs it serves); stop with ``aclose()``."""

    def __init__(
        self,
        settings: EmulatorSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        apis: Sequence[Api] = (),
    ) -> None:
        self.settings = settings
        self.apis = tuple(apis)  # each: the routes of one HTTP API (OpenAI's, SGLang's native)
        self.profile = settings.resolved_profile()
        self.clock = clock
        self.wall_clock = wall_clock
        vllm = settings.flavor == "vllm"  # --flavor vllm: vLLM's names, routes, events
        self.metrics: EmulatorMetrics | VllmMetrics = (
            VllmMetrics(settings.model, self.profile.page_size)
            if vllm
            else EmulatorMetrics(settings.model)
        )
        # --tokenizer-path: the model's tokenizer and chat template (TokenizerFilesError if bad)
        path = settings.tokenizer_path
        self.model = HfChatTokenizer.load(path) if path else None
        # SGLang's --enable-trace: one span per request, parent from the caller's traceparent
        self.tracing = (
            Tracing(settings.otlp_traces_endpoint, "sglang-emulator")
            if settings.enable_trace
            else None
        )
        kv = settings.kv_events
        self.kv_events = (
            KvEventPublisher(kv, wall_clock=wall_clock, encode=VllmEventEncoder() if vllm else None)
            if kv is not None and kv.enabled
            else None
        )
        self.request_log = (
            RequestLog(self.metrics, settings.request_log) if settings.request_log else None
        )
        # --enable-lora: the adapters requests may name, and the GPU slots (lora.py)
        lc = settings.lora
        self.lora_registry = LoraRegistry(lc)
        self.lora_slots = LoraSlots(lc.max_loras_per_batch, lc.load_s)
        self.scheduler = Scheduler(
            self.profile,
            time_scale=settings.time_scale,
            server_seed=settings.seed,
            stop_prob=settings.stop_prob,
            observer=self.request_log or self.metrics,
            clock=clock,
            kv_sink=self.kv_events.publish if self.kv_events is not None else None,
            priority=settings.priority,
            lora_slots=self.lora_slots if lc.enabled else None,
        )
        self.metrics.bind(self.scheduler.stats)
        if lc.enabled:
            register_lora_metrics(
                self.metrics.registry, settings.model, self.lora_registry, self.lora_slots
            )
        self.faults = FaultConfig(
            error_rate=settings.error_rate,
            hang_rate=settings.hang_rate,
            slow=settings.slow_factor,
            unavailable_until=clock() + settings.slow_start_s,
        )
        self.scheduler.slow_factor = settings.slow_factor
        # --disaggregation-mode prefill|decode: the PD side of this server (disagg.py)
        pd = settings.disaggregation
        self.disagg: PrefillSide | DecodeSide | None = (
            PrefillSide(self, pd) if pd.mode == "prefill"
            else DecodeSide(self, pd) if pd.mode == "decode" else None
        )  # fmt: skip
        self._fault_rng = random.Random(settings.seed)
        self._ids = itertools.count(1)
        # POST /abort_request calls that arrived, and the requests they stopped
        self.abort_requests: dict[str, int] = {"received": 0, "aborted": 0}
        self._hang_gate = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task[object]] = set()
        self._inflight: set[asyncio.BaseTransport] = set()  # connections with a request
        self.closing = False
        self.crashed = False
        self.port = 0

    def encode_text(self, text: str) -> list[int]:
        """A plain prompt's ids (/generate text, /v1/completions prompt): the emulator's word
        tokens, or the model's with the special tokens its tokenizer adds first (as SGLang)."""
        if self.model is None:
            return encode(text)
        try:
            return self.model.encode(self.model.plain_prompt(text))
        except ChatTemplateError as exc:
            raise RequestError(str(exc), "prompt") from exc

    def encode_chat(self, body: Mapping[str, object]) -> list[int]:
        """A chat completion's prompt ids: the emulator's template, or the model's as SGLang
        applies it (RequestError when the template refuses the messages)."""
        if self.model is None:
            return encode(render_chat(body.get("messages")))
        try:
            return self.model.encode(self.model.render_request(body))
        except ChatTemplateError as exc:
            raise RequestError(str(exc), "messages") from exc

    def disagg_info(self) -> DisaggInfo:
        """SGLang's server_info keys for PD mode (the bootstrap port actually bound)."""
        pd = self.settings.disaggregation
        port = self.disagg.port if isinstance(self.disagg, PrefillSide) else pd.bootstrap_port
        return {"disaggregation_mode": pd.mode, "disaggregation_bootstrap_port": port}

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    # ---- lifecycle ----------------------------------------------------------------------
    def build_app(self) -> web.Application:
        @web.middleware
        async def track(request: web.Request, handler: _Handler) -> web.StreamResponse:
            transport = request.transport
            if transport is not None:
                self._inflight.add(transport)
            status: int | None = None
            try:
                response = await _map_errors(request, handler)
                status = response.status
                return response
            finally:
                self._inflight.discard(transport)
                if self.tracing is not None:
                    end_request_span(request, status)

        app = web.Application(middlewares=[track], client_max_size=64 * 1024**2)
        for api in self.apis:
            app.add_routes(api(self))
        return app

    async def start(self) -> None:
        if self.kv_events is not None:
            await self.kv_events.start()
        self.scheduler.start()
        if self.disagg is not None:
            await self.disagg.start(self.settings.host)
        self._runner = web.AppRunner(
            self.build_app(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port, backlog=4096)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def aclose(self) -> None:
        """Stop serving, abort every request, release hung handlers, stop the scheduler."""
        if self.closing:
            return
        self.closing = True
        self._hang_gate.set()
        await self.scheduler.aclose()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.disagg is not None:
            await self.disagg.aclose()
        if self.kv_events is not None:
            await self.kv_events.aclose()
        if self.tracing is not None:
            await self.tracing.aclose()
        if self.request_log is not None:
            self.request_log.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def spawn(self, coro: Awaitable[object]) -> None:
        """Run a background task that ``aclose`` stops."""
        task: asyncio.Task[object] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def set_faults(self, faults: FaultConfig) -> None:
        self.faults = faults
        self.scheduler.slow_factor = faults.slow
        if faults.crash and not self.crashed:
            self.crashed = True
            self.spawn(self._crash())

    async def _crash(self) -> None:
        await asyncio.sleep(0.05)  # let the fault endpoint answer first
        log.error("emulator: crash fault injected")
        if self.settings.exit_on_crash:
            os._exit(70)
        self.closing = True
        for transport in list(self._inflight):  # cut connections as a dying process would
            if isinstance(transport, asyncio.Transport):
                transport.abort()
        self._hang_gate.set()
        await self.scheduler.aclose()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ---- admission ----------------------------------------------------------------------
    def available(self) -> bool:
        return (
            not self.closing
            and self.scheduler.healthy
            and self.clock() >= self.faults.unavailable_until
        )

    def with_adapter(
        self, params: GenerationParams, body: Mapping[str, object], *, openai: bool
    ) -> GenerationParams:
        """``params`` with the adapter ``body`` names (400 when LoRA is off or it is unknown)."""
        name = adapter_of(body, openai=openai)
        if name is None:
            return params
        if not self.settings.lora.enabled:
            raise RequestError(NOT_ENABLED, "lora_path")
        self.lora_registry.acquire(name)
        return dataclasses.replace(params, lora=name)

    def next_id(self) -> str:
        return f"{self.port:x}{next(self._ids):08x}"

    async def open_request(
        self,
        params: GenerationParams,
        rid: str,
        http: web.Request | None = None,
        bootstrap: Bootstrap | None = None,
    ) -> EmuRequest:
        """Admit a request to the scheduler after the fault checks (may hang on purpose).
        With tracing on, ``http`` (the HTTP request) gets the request's span, ended by the
        middleware once the answer is written. In PD mode a request with ``bootstrap`` fields
        goes through its side of the KV hand-over first (``disagg``)."""
        if self.disagg is not None and bootstrap is not None:
            return await self.disagg.open(self._open_request, params, rid, http, bootstrap)
        return await self._open_request(params, rid, http, False)

    async def _open_request(
        self, params: GenerationParams, rid: str, http: web.Request | None, transferred: bool
    ) -> EmuRequest:
        if self.closing:
            raise ServerClosingError("the server is shutting down")
        if not self.available():
            raise ServerClosingError("the server is starting")
        decision = decide(self.faults, self._fault_rng)
        if decision == "error":
            raise InjectedFaultError("injected fault: internal error")
        if decision == "hang":
            await self._hang_gate.wait()
            raise ServerClosingError("the server is shutting down")
        req = EmuRequest(
            rid=rid,
            params=params,
            rng=self.scheduler.words.rng_for(self.settings.seed, params.prompt_ids),
            arrival=self.clock(),
            kv_transferred=transferred,
        )
        req = self.scheduler.add(req)
        if self.tracing is not None and http is not None:
            start_request_span(self.tracing, http, req, self.settings.model)
        return req

    async def run_to_end(self, req: EmuRequest) -> None:
        """Wait for a non-streamed request; abort it if the client goes away — at once, or
        with ``disconnect_check`` at the next check (SGLang looks every 4 s of the request's
        wait: one that ends before then runs to its end, its answer written to nobody)."""
        started = time.monotonic()
        try:
            await req.wait_done()
        except asyncio.CancelledError:
            every = self.settings.disconnect_check
            if every > 0 and not req.done:
                waited = time.monotonic() - started
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(req.wait_done()), every - waited % every)
            raise
        finally:
            if not req.done:
                self.scheduler.abort(req)
