"""How admission is wired: the ext_proc filter config, the route's phases, the server's hold
and its cleanup when Envoy resets a stream while a request waits (no network)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import grpc
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2, processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from controlplane.translate.ext_proc import (
    EXT_PROC_FILTER,
    ext_proc_http_filter,
    ext_proc_per_route,
)
from filters.api import BasePlugin
from filters.plugins.admission.gate import Gates
from filters.registry import build_routes
from filters.server import FilterServicer
from policy import load_policy_text
from tests.filters.conftest import FakeClock, make_services
from tests.filters.test_server import headers_msg

PM = processing_mode_pb2.ProcessingMode

POLICY = """
version: 1
filters: {{address: 127.0.0.1:18082, message_timeout: 300ms}}
admission: {{interactive: {{ttft_budget: 4s}}, batch: {{ttft_budget: 20s, max_wait: 7s}}}}
pools: {{chat: {{models: [m1], endpoints: [127.0.0.1:9000], capacity: {{max_running_requests: 1}}}}}}
gateways:
  edge:
    routes:
      - name: llm
        pool: chat
        match: {{prefix: /v1/}}
        filters: {{plugins: [{plugins}]}}
"""


def config(plugins: str) -> ext_proc_pb2.ExternalProcessor:
    cfg = ext_proc_pb2.ExternalProcessor()
    assert ext_proc_http_filter(
        load_policy_text(POLICY.format(plugins=plugins))
    ).typed_config.Unpack(cfg)
    return cfg


def test_the_filter_may_hold_a_request_as_long_as_the_longest_lane_wait() -> None:
    cfg = config("identity, lane, admission")
    assert cfg.max_message_timeout.ToMilliseconds() == 9000  # 7 s wait + 2 s slack
    assert cfg.mutation_rules.allow_envoy.value is True  # x-envoy-upstream-rq-timeout-ms
    plain = config("identity, lane")
    assert not plain.HasField("max_message_timeout") and not plain.HasField("mutation_rules")


def test_admission_keeps_the_stream_open_to_the_response_end() -> None:
    policy = load_policy_text(POLICY.format(plugins="identity, lane, admission"))
    msg = ext_proc_pb2.ExtProcPerRoute()
    assert ext_proc_per_route(policy.gateways["edge"].routes[0])[EXT_PROC_FILTER].Unpack(msg)
    # no chunk to the filter server: the response trailers, asked for, keep the stream open to
    # the response's end (tests/integration/test_response_end.py)
    mode = msg.overrides.processing_mode
    assert mode.response_body_mode == PM.NONE and mode.response_trailer_mode == PM.SEND
    assert mode.request_body_mode == PM.NONE


class Stream:
    def __init__(self, msgs: list[pb.ProcessingRequest]) -> None:
        self.incoming = list(msgs)
        self.sent: list[pb.ProcessingResponse] = []

    def invocation_metadata(self) -> Any:
        return (("x-tokenweir-route", "llm"),)

    async def read(self) -> Any:
        if self.incoming:
            return self.incoming.pop(0)
        await asyncio.Event().wait()  # Envoy keeps the stream open
        return grpc.aio.EOF

    async def write(self, msg: pb.ProcessingResponse) -> None:
        self.sent.append(msg)


async def test_a_waiting_request_asks_envoy_to_hold_and_leaves_the_queue_on_reset() -> None:
    policy = load_policy_text(POLICY.format(plugins="admission"))
    clock = FakeClock()
    gates = Gates(clock=clock, wall=clock)
    gates.configure(policy)
    services = make_services(policy, clock)
    services = replace(services, gates=gates)
    servicer = FilterServicer(
        build_routes(policy, services), clock=clock, metrics=services.metrics, message_timeout=0.3
    )
    first = Stream([headers_msg({":path": "/v1/x"})])
    running = asyncio.create_task(servicer.Process(None, first))
    second = Stream([headers_msg({":path": "/v1/x"})])
    waiting = asyncio.create_task(servicer.Process(None, second))
    for _ in range(10):
        await asyncio.sleep(0)
    gate = gates.gate("chat")
    assert gate is not None and gate.core.in_flight == 1
    assert len(gate.core.queues["interactive"]) == 1
    (hold,) = second.sent  # only the hold so far: wait (2 s) + the answer's slack (2 s)
    assert hold.override_message_timeout.ToMilliseconds() == 4000
    waiting.cancel()  # Envoy reset the stream (client gone)
    for _ in range(10):
        await asyncio.sleep(0)
    assert len(gate.core.queues["interactive"]) == 0
    running.cancel()  # and the running one: its slot is freed at stream end
    for _ in range(10):
        await asyncio.sleep(0)
    assert gate.core.in_flight == 0


class Stuck(BasePlugin):
    """A plugin after admission that never answers (its I/O hangs)."""

    name = "stuck"

    def __init__(self, settings: Any, services: Any) -> None:
        pass

    async def request_headers(self, ctx: Any, headers: Any, end_of_stream: bool) -> None:
        await asyncio.Event().wait()


async def test_a_reset_after_admission_but_before_the_answer_frees_the_slot() -> None:
    plugins = 'admission, "tests.filters.admission.test_wiring:Stuck"'
    policy = load_policy_text(POLICY.format(plugins=plugins))
    clock = FakeClock()
    gates = Gates(clock=clock, wall=clock)
    gates.configure(policy)
    services = replace(make_services(policy, clock), gates=gates)
    servicer = FilterServicer(build_routes(policy, services), clock=clock, metrics=services.metrics)
    task = asyncio.create_task(servicer.Process(None, Stream([headers_msg({":path": "/v1/x"})])))
    for _ in range(10):
        await asyncio.sleep(0)
    gate = gates.gate("chat")
    assert gate is not None and gate.core.in_flight == 1  # admitted, stuck in the next plugin
    task.cancel()
    for _ in range(10):
        await asyncio.sleep(0)
    assert gate.core.in_flight == 0
