"""ext_proc messages ↔ the chain's plain values. No plugin logic here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from filters.api import Reply
from filters.chain import Outcome

__all__ = [
    "CONTINUE_REQUEST_BODY",
    "CONTINUE_RESPONSE_BODY",
    "CONTINUE_RESPONSE_HEADERS",
    "METADATA_NAMESPACE",
    "body_response",
    "header_map",
    "headers_response",
    "immediate",
    "trailers_response",
]

METADATA_NAMESPACE = "tokenweir"
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def header_map(headers: Any) -> dict[str, str]:
    """An Envoy HeaderMap as a dict (lower-case names; the last of repeated names wins)."""
    out: dict[str, str] = {}
    for h in headers.headers:
        out[h.key] = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
    return out


def _mutation(set_headers: Mapping[str, str], remove: list[str]) -> pb.HeaderMutation:
    return pb.HeaderMutation(
        set_headers=[
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=k, raw_value=v.encode()), append_action=_OVERWRITE
            )
            for k, v in set_headers.items()
        ],
        remove_headers=remove,
    )


def _common(out: Outcome) -> pb.CommonResponse:
    common = pb.CommonResponse(clear_route_cache=out.clear_route_cache)
    if out.set_headers or out.remove_headers:
        common.header_mutation.CopyFrom(_mutation(out.set_headers, out.remove_headers))
    if out.body is not None:
        common.body_mutation.body = out.body
    return common


def _value(v: Any) -> struct_pb2.Value:
    if isinstance(v, bool):
        return struct_pb2.Value(bool_value=v)
    if isinstance(v, int | float):
        return struct_pb2.Value(number_value=v)
    if isinstance(v, str):
        return struct_pb2.Value(string_value=v)
    s = struct_pb2.Struct()
    s.update({"v": v})
    return s.fields["v"]


def _with_metadata(resp: pb.ProcessingResponse, out: Outcome) -> pb.ProcessingResponse:
    if out.metadata:
        inner = struct_pb2.Struct(fields={k: _value(v) for k, v in out.metadata.items()})
        ns = resp.dynamic_metadata.fields[METADATA_NAMESPACE]
        ns.struct_value.CopyFrom(inner)
    return resp


def headers_response(phase: str, out: Outcome) -> pb.ProcessingResponse:
    """Answer to ``request_headers`` or ``response_headers``."""
    if out.reply is not None:
        return immediate(out.reply)
    resp = pb.ProcessingResponse(**{phase: pb.HeadersResponse(response=_common(out))})
    return _with_metadata(resp, out)


def body_response(phase: str, out: Outcome) -> pb.ProcessingResponse:
    """Answer to ``request_body`` or ``response_body``."""
    if out.reply is not None:
        return immediate(out.reply)
    resp = pb.ProcessingResponse(**{phase: pb.BodyResponse(response=_common(out))})
    return _with_metadata(resp, out)


def trailers_response(phase: str) -> pb.ProcessingResponse:
    return pb.ProcessingResponse(**{phase: pb.TrailersResponse()})


def immediate(reply: Reply) -> pb.ProcessingResponse:
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=reply.status),  # type: ignore[arg-type]
            headers=_mutation(reply.headers, []),
            body=reply.body,
            details=reply.details,
        )
    )


CONTINUE_REQUEST_BODY = pb.ProcessingResponse(request_body=pb.BodyResponse())
CONTINUE_RESPONSE_HEADERS = pb.ProcessingResponse(response_headers=pb.HeadersResponse())
CONTINUE_RESPONSE_BODY = pb.ProcessingResponse(response_body=pb.BodyResponse())
