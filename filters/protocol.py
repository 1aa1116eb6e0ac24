"""ext_proc messages ↔ the chain's plain values. No plugin logic here."""

from __future__ import annotations

from collections.abc import Mapping

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from filters.api import Reply
from filters.chain import Outcome
from wire.contract import METADATA_NAMESPACE
from wire.jsontypes import JsonValue

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

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def header_map(headers: base_pb2.HeaderMap) -> dict[str, str]:
    """An Envoy HeaderMap as a dict (lower-case names; the last of repeated names wins)."""
    return {
        h.key: (raw.decode("utf-8", "replace") if (raw := h.raw_value) else h.value)
        for h in headers.headers
    }


def _fill_mutation(m: pb.HeaderMutation, set_headers: Mapping[str, str], remove: list[str]) -> None:
    """Fill ``m`` in place (cheaper than building messages and copying them in)."""
    add = m.set_headers.add
    for k, v in set_headers.items():
        h = add(append_action=_OVERWRITE).header
        h.key = k
        h.raw_value = v.encode()
    if remove:
        m.remove_headers.extend(remove)


def _fill_common(common: pb.CommonResponse, out: Outcome) -> None:
    common.SetInParent()
    if out.clear_route_cache:
        common.clear_route_cache = True
    if out.set_headers or out.remove_headers:
        m = common.header_mutation
        m.SetInParent()
        _fill_mutation(m, out.set_headers, out.remove_headers)
    if out.body is not None:
        common.body_mutation.body = out.body


def _value(v: JsonValue) -> struct_pb2.Value:
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
    """The dynamic metadata, filled in place (a third cheaper than building a Struct of Values
    and copying it in)."""
    if out.metadata:
        fields = resp.dynamic_metadata.fields[METADATA_NAMESPACE].struct_value.fields
        for k, v in out.metadata.items():
            if isinstance(v, bool):
                fields[k].bool_value = v
            elif isinstance(v, int | float):
                fields[k].number_value = v
            elif isinstance(v, str):
                fields[k].string_value = v
            else:
                fields[k].CopyFrom(_value(v))
    return resp


def headers_response(phase: str, out: Outcome) -> pb.ProcessingResponse:
    """Answer to ``request_headers`` or ``response_headers``."""
    if out.reply is not None:
        return immediate(out.reply)
    resp = pb.ProcessingResponse()
    _fill_common(getattr(resp, phase).response, out)
    return _with_metadata(resp, out)


def body_response(phase: str, out: Outcome) -> pb.ProcessingResponse:
    """Answer to ``request_body`` or ``response_body``."""
    if out.reply is not None:
        return immediate(out.reply)
    resp = pb.ProcessingResponse()
    _fill_common(getattr(resp, phase).response, out)
    return _with_metadata(resp, out)


def trailers_response(phase: str) -> pb.ProcessingResponse:
    return pb.ProcessingResponse(**{phase: pb.TrailersResponse()})


def immediate(reply: Reply) -> pb.ProcessingResponse:
    resp = pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=reply.status),  # type: ignore[arg-type]  # the stub wants the StatusCode enum; any int status is valid on the wire
            body=reply.body,
            details=reply.details,
        )
    )
    headers = resp.immediate_response.headers
    headers.SetInParent()
    _fill_mutation(headers, reply.headers, [])
    return resp


CONTINUE_REQUEST_BODY = pb.ProcessingResponse(request_body=pb.BodyResponse())
CONTINUE_RESPONSE_HEADERS = pb.ProcessingResponse(response_headers=pb.HeadersResponse())
CONTINUE_RESPONSE_BODY = pb.ProcessingResponse(response_body=pb.BodyResponse())
