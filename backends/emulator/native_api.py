"""SGLang's native endpoints: /generate, health, server info, load, cache flush, abort, metrics;
and the emulator's own fault endpoint ``/_emulator/faults``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from aiohttp import web

from backends.emulator.disagg import parse_bootstrap
from backends.emulator.faults import update_faults
from backends.emulator.metrics import CONTENT_TYPE
from backends.emulator.protocol import (
    DONE,
    context_check,
    output_text,
    parse_bool,
    parse_json_object,
    parse_max_tokens,
    parse_priority,
    parse_stop,
    sse,
)
from backends.emulator.request import EmuRequest, GenerationParams
from backends.emulator.shapes import GenerateResult, LoraInfo, ServerInfo
from backends.emulator.tokenizer import encode
from backends.errors import RequestError, SchedulerAbortError, ServerClosingError
from wire.jsontypes import JsonObject

if TYPE_CHECKING:
    from backends.emulator.server import EmulatorServer

__all__ = ["routes"]

log = logging.getLogger(__name__)

_HEALTH_GENERATE_TIMEOUT_S = 20.0  # SGLang's budget for the 1-token health generation


def routes(server: EmulatorServer) -> list[web.RouteDef]:
    api = _NativeApi(server)
    return [
        web.post("/generate", api.generate),
        web.get("/health", api.health),
        web.get("/health_generate", api.health_generate),
        web.get("/get_server_info", api.server_info),
        web.get("/server_info", api.server_info),
        web.get("/get_model_info", api.model_info),
        web.get("/get_load", api.load),
        web.post("/flush_cache", api.flush_cache),
        web.post("/abort_request", api.abort_request),
        web.get("/flush_cache", api.flush_cache),
        web.get("/metrics", api.metrics),
        web.get("/_emulator/faults", api.get_faults),
        web.get("/_emulator/state", api.state),
        web.post("/_emulator/faults", api.post_faults),
    ]


def _finish_reason(req: EmuRequest) -> JsonObject | None:
    if req.finish_reason == "length":
        return {"type": "length", "length": len(req.output_ids)}
    if req.finish_reason == "stop":
        return {"type": "stop", "matched": req.matched_stop}
    if req.finish_reason == "abort" and req.abort_message is not None:  # the scheduler's abort
        return {"type": "abort", "message": req.abort_message, "status_code": 503}
    if req.finish_reason == "abort":
        return {"type": "abort", "message": "request aborted"}
    return None


class _NativeApi:
    def __init__(self, server: EmulatorServer) -> None:
        self.server = server

    # ---- /generate ----------------------------------------------------------------------
    def _params(self, body: Mapping[str, object]) -> GenerationParams:
        text, input_ids = body.get("text"), body.get("input_ids")
        if isinstance(text, list) or (
            isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], list)
        ):
            raise RequestError("batched /generate is not supported by the emulator", "text")
        if isinstance(text, str):
            ids = self.server.encode_text(text)
        elif isinstance(input_ids, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in input_ids
        ):
            ids = list(input_ids)
        else:
            raise RequestError("either text (a string) or input_ids (a list) is required", "text")
        sp = body.get("sampling_params") or {}
        if not isinstance(sp, dict):
            raise RequestError("sampling_params must be an object", "sampling_params")
        params = context_check(
            ids,
            parse_max_tokens(sp, ("max_new_tokens",)),
            default=self.server.settings.default_max_tokens,
            context_length=self.server.profile.context_length,
            ignore_eos=parse_bool(sp, "ignore_eos"),
            stop=parse_stop(sp.get("stop")),
            priority=parse_priority(body),
        )
        return self.server.with_adapter(params, body, openai=False)

    def _result(self, req: EmuRequest) -> GenerateResult:
        end = req.finished_at if req.finished_at is not None else self.server.clock()
        return {
            "text": output_text(req.output_words),
            "output_ids": list(req.output_ids),
            "meta_info": {
                "id": req.rid,
                "finish_reason": _finish_reason(req),
                "prompt_tokens": req.prompt_len,
                "completion_tokens": len(req.output_ids),
                "cached_tokens": req.cached_tokens,
                "e2e_latency": end - req.arrival,
            },
        }

    async def _rejected_stream(
        self, request: web.Request, rid: str, params: GenerationParams, message: str
    ) -> web.StreamResponse:
        """SGLang's streamed /generate ends a request the queue cannot hold with an abort
        result (``finish_reason.status_code`` 503) inside a 200 event stream."""
        reason = {"type": "abort", "message": message, "status_code": 503}
        meta = {"id": rid, "finish_reason": reason, "prompt_tokens": len(params.prompt_ids),
                "completion_tokens": 0, "cached_tokens": 0}  # fmt: skip
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        with contextlib.suppress(ConnectionResetError):
            body = {"text": "", "output_ids": [], "meta_info": meta}
            await resp.write(sse(json.dumps(body)) + DONE)
            await resp.write_eof()
        return resp

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = parse_json_object(await request.read())
        params = self._params(body)
        rid = body.get("rid")
        rid = rid if isinstance(rid, str) and rid else self.server.next_id()
        try:
            req = await self.server.open_request(params, rid, request, parse_bootstrap(body))
        except SchedulerAbortError as exc:
            if not parse_bool(body, "stream"):
                raise
            return await self._rejected_stream(request, rid, params, str(exc))
        if not parse_bool(body, "stream"):
            await self.server.run_to_end(req)
            if req.abort_message is not None:  # a more urgent request took its queue place
                raise SchedulerAbortError(req.abort_message)
            return web.json_response(self._result(req))
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        try:
            while True:
                await req.wait()
                if req.take_new_words() or req.done:  # text is cumulative, as SGLang's
                    await resp.write(sse(json.dumps(self._result(req))))
                if req.done and req.read_upto >= len(req.output_words):
                    break
            await resp.write(DONE)
            await resp.write_eof()
        except ConnectionResetError:
            pass
        finally:
            if not req.done:
                self.server.scheduler.abort(req)
        return resp

    # ---- health and info ----------------------------------------------------------------
    async def health(self, request: web.Request) -> web.StreamResponse:
        if not self.server.available():
            return web.Response(status=503)
        return web.Response(status=200)

    async def health_generate(self, request: web.Request) -> web.StreamResponse:
        if not self.server.available():
            return web.Response(status=503)
        params = GenerationParams(prompt_ids=tuple(encode("health check")), max_new_tokens=1)
        try:
            req = await asyncio.wait_for(
                self.server.open_request(params, "HEALTH_CHECK_" + self.server.next_id()),
                _HEALTH_GENERATE_TIMEOUT_S,
            )
            await asyncio.wait_for(self.server.run_to_end(req), _HEALTH_GENERATE_TIMEOUT_S)
        except (TimeoutError, ServerClosingError):
            return web.Response(status=503)
        return web.Response(status=200 if req.output_ids else 503)

    def _info(self) -> ServerInfo:
        s, p = self.server.settings, self.server.profile
        return {
            "model_path": s.model,
            "served_model_name": s.model,
            "host": s.host,
            "port": self.server.port,
            "max_running_requests": p.max_running_requests,
            "max_queued_requests": p.max_queued_requests,
            "max_total_tokens": p.max_total_tokens,
            "max_total_num_tokens": p.max_total_tokens,
            "chunked_prefill_size": p.chunked_prefill_size,
            "page_size": p.page_size,
            "context_length": p.context_length,
            "schedule_policy": "fcfs",
            "enable_priority_scheduling": s.priority.enabled,
            "schedule_low_priority_values_first": s.priority.low_values_first,
            "priority_scheduling_preemption_threshold": s.priority.preemption_threshold,
            "abort_on_priority_when_disabled": s.priority.abort_when_disabled,
            "enable_metrics": True,
            "enable_cache_report": s.enable_cache_report,
            "random_seed": s.seed,
            "kv_events_config": self._kv_events_config(),
            **self.server.disagg_info(),
            **self._lora_info(),
            "version": "tokenweir-emulator",
            "emulator": {"profile": p.name, "time_scale": s.time_scale, "source": p.source},
            "internal_states": [
                {
                    "max_total_num_tokens": p.max_total_tokens,
                    "max_running_requests": p.max_running_requests,
                    "last_gen_throughput": self.server.scheduler.stats().gen_throughput,
                }
            ],
        }

    def _lora_info(self) -> LoraInfo:
        """SGLang's LoRA server args, and (the emulator's) what is registered and resident."""
        lc = self.server.settings.lora
        return {
            "enable_lora": lc.enabled,
            "lora_paths": [{"lora_name": n, "lora_path": p} for n, p in lc.paths] or None,
            "max_loras_per_batch": lc.max_loras_per_batch,
            "max_loaded_loras": lc.max_loaded_loras,
            "max_lora_rank": lc.max_lora_rank,
            "loaded_lora_adapters": self.server.lora_registry.loaded(),
            "resident_lora_adapters": self.server.lora_slots.resident(),
        }

    def _kv_events_config(self) -> str | None:
        """SGLang's server argument, with the ports the emulator actually bound."""
        publisher = self.server.kv_events
        if publisher is None:
            return None
        cfg = dataclasses.replace(
            publisher.config,
            endpoint=publisher.endpoint or publisher.config.endpoint,
            replay_endpoint=publisher.replay_endpoint,
        )
        return cfg.to_json()

    async def server_info(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self._info())

    async def model_info(self, request: web.Request) -> web.StreamResponse:
        s = self.server.settings
        return web.json_response(
            {"model_path": s.model, "tokenizer_path": s.model, "is_generation": True}
        )

    async def load(self, request: web.Request) -> web.StreamResponse:
        st = self.server.scheduler.stats()
        return web.json_response(
            [
                {
                    "dp_rank": 0,
                    "num_reqs": st.num_running_reqs + st.num_queue_reqs,
                    "num_running_reqs": st.num_running_reqs,
                    "num_waiting_reqs": st.num_queue_reqs,
                    "num_tokens": st.num_used_tokens,
                }
            ]
        )

    async def state(self, request: web.Request) -> web.StreamResponse:
        """The emulator's own view (not SGLang's): the priorities running and waiting, and the
        requests preempted so far; benchmarks sample it to show where a lane waits."""
        sched = self.server.scheduler

        def by_priority(reqs: Iterable[EmuRequest]) -> dict[str, int]:
            out: dict[str, int] = {}
            for r in reqs:
                out[str(r.priority)] = out.get(str(r.priority), 0) + 1
            return out

        return web.json_response(
            {
                "running": by_priority(sched.running),
                "prefilling": by_priority(r for r in sched.running if not r.prefill_done),
                "waiting": by_priority(sched.waiting),
                "preempted_total": sched.preempted_total,
                "abort_requests": dict(self.server.abort_requests),
                "disaggregation": self.server.disagg.state() if self.server.disagg else None,
            }
        )

    async def flush_cache(self, request: web.Request) -> web.StreamResponse:
        if self.server.scheduler.flush_cache():
            return web.Response(text="Cache flushed.\n", status=200)
        return web.Response(
            text="Cache not flushed: there are running or waiting requests.\n", status=400
        )

    async def abort_request(self, request: web.Request) -> web.StreamResponse:
        """SGLang's ``POST /abort_request`` (``AbortReq``: ``rid``, ``abort_all``): the request
        with that rid stops where it is (waiting or running: its KV cache is freed, its stream
        ends); an unknown rid is no error (SGLang answers 200 and does nothing). The emulator
        counts what arrived in ``/_emulator/state`` (``abort_requests``) and logs each one."""
        body = parse_json_object(await request.read())
        rid = body.get("rid")
        abort_all = parse_bool(body, "abort_all")
        if rid is not None and not isinstance(rid, str):
            raise RequestError("rid must be a string", "rid")
        sched = self.server.scheduler
        found = [r for r in (*sched.running, *sched.waiting) if abort_all or (rid and r.rid == rid)]
        for r in found:
            sched.abort(r)
        counts = self.server.abort_requests
        counts["received"] += 1
        counts["aborted"] += len(found)
        log.info("abort_request rid=%s abort_all=%s: %d aborted", rid, abort_all, len(found))
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=self.server.metrics.render(), headers={"Content-Type": CONTENT_TYPE}
        )

    # ---- faults -------------------------------------------------------------------------
    async def get_faults(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.server.faults.to_json(self.server.clock()))

    async def post_faults(self, request: web.Request) -> web.StreamResponse:
        body = parse_json_object(await request.read())
        now = self.server.clock()
        self.server.set_faults(update_faults(self.server.faults, body, now))
        return web.json_response(self.server.faults.to_json(now))
