"""A small OTLP/gRPC trace receiver for tests: the real ``TraceService`` of the
opentelemetry-proto package on a loopback port; it keeps every span it is sent."""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

__all__ = ["OtlpReceiver", "ReceivedSpan"]


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    attributes: dict[str, Any] = field(default_factory=dict)


class _Service(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, sink: OtlpReceiver) -> None:
        self.sink = sink

    def Export(self, request: Any, context: Any) -> Any:
        got = []
        for rs in request.resource_spans:
            attrs = {a.key: _value(a.value) for a in rs.resource.attributes}
            service = str(attrs.get("service.name", ""))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(
                        ReceivedSpan(
                            service, s.name, s.trace_id.hex(), s.span_id.hex(),
                            s.parent_span_id.hex(),
                            {a.key: _value(a.value) for a in s.attributes},
                        )
                    )  # fmt: skip
        with self.sink.lock:
            self.sink.spans.extend(got)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    """``with OtlpReceiver(port) as rx: ... rx.spans``."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.spans: list[ReceivedSpan] = []
        self.lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Service(self), self._server)
        self._server.add_insecure_port(f"127.0.0.1:{port}")

    def snapshot(self) -> list[ReceivedSpan]:
        with self.lock:
            return list(self.spans)

    def __enter__(self) -> OtlpReceiver:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(0.5).wait()
