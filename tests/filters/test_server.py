from __future__ import annotations

import json

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import json_format

from filters.registry import build_routes
from filters.server import FilterServicer
from filters.services import Services
from policy import Policy
from tests.filters.conftest import FakeClock


class FakeContext:
    """grpc.aio's servicer context, as far as the servicer uses it: metadata, read, write."""

    def __init__(self, route: str | None, msgs: list[pb.ProcessingRequest]) -> None:
        self.md = (("x-tokenweir-route", route),) if route else ()
        self.incoming = list(msgs)
        self.sent: list[pb.ProcessingResponse] = []

    def invocation_metadata(self):  # type: ignore[no-untyped-def]
        return self.md

    async def read(self):  # type: ignore[no-untyped-def]
        return self.incoming.pop(0) if self.incoming else grpc.aio.EOF

    async def write(self, msg: pb.ProcessingResponse) -> None:
        self.sent.append(msg)


def headers_msg(headers: dict[str, str], eos: bool = False) -> pb.ProcessingRequest:
    hm = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
    )
    return pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=hm, end_of_stream=eos))


async def drive(servicer: FilterServicer, route: str | None, msgs: list[pb.ProcessingRequest]):  # type: ignore[no-untyped-def]
    context = FakeContext(route, msgs)
    await servicer.Process(None, context)
    return context.sent


def servicer_for(policy: Policy, services: Services) -> FilterServicer:
    return FilterServicer(
        build_routes(policy, services), clock=FakeClock(), metrics=services.metrics
    )


def set_headers(resp: pb.CommonResponse) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in resp.header_mutation.set_headers}


BASE = {":method": "POST", ":path": "/v1/chat/completions", "x-request-id": "rid-1",
        "content-type": "application/json"}  # fmt: skip


async def test_full_request_and_streamed_response(policy: Policy, services: Services) -> None:
    s = servicer_for(policy, services)
    body = json.dumps(
        {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    ).encode()
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}\n\n'
    msgs = [
        headers_msg({**BASE, "authorization": "Bearer tw-demo-free-key", "x-tokenweir-tenant": "demo-pro"}),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
        pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
            base_pb2.HeaderValue(key=":status", raw_value=b"200"),
            base_pb2.HeaderValue(key="content-type", raw_value=b"text/event-stream")]))),
        pb.ProcessingRequest(response_body=pb.HttpBody(body=b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n')),
        pb.ProcessingRequest(response_body=pb.HttpBody(body=usage)),
        pb.ProcessingRequest(response_body=pb.HttpBody(body=b"data: [DONE]\n\n", end_of_stream=True)),
    ]  # fmt: skip
    out = await drive(s, "chat-completions", msgs)
    assert [r.WhichOneof("response") for r in out] == [
        "request_headers", "request_body", "response_headers",
        "response_body", "response_body", "response_body",
    ]  # fmt: skip
    h = out[0].request_headers.response
    assert "x-tokenweir-tenant" not in h.header_mutation.remove_headers  # set, not removed
    assert set_headers(h)["x-tokenweir-tenant"] == "demo-free"
    assert set_headers(h)["x-tokenweir-reserve"] == "0"
    b = out[1].request_body.response
    hb = set_headers(b)
    assert set_headers(h)["x-tokenweir-lane"] == "batch"  # tenant and lane: set with the headers
    sent = json.loads(b.body_mutation.body)
    assert sent["max_tokens"] == 256 and sent["stream_options"] == {"include_usage": True}
    assert int(hb["x-tokenweir-reserve"]) > 256 and b.clear_route_cache
    assert "x-prefix-hash" in hb
    dropped = out[4]
    assert dropped.response_body.response.body_mutation.body == b""
    md = json_format.MessageToDict(dropped.dynamic_metadata)
    assert md["tokenweir"]["settle_tokens"] == 8.0
    # the settlement has a value from the start (0: nothing produced yet), then what the
    # stream produced so far (prompt estimate + one token per event), then the real usage
    first = json_format.MessageToDict(out[0].dynamic_metadata)
    assert first["tokenweir"]["settle_tokens"] == 0.0
    # who the request is for, for the access log: from the API key, never from a header
    assert first["tokenweir"]["tenant"] == "demo-free" and first["tokenweir"]["lane"] == "batch"
    running = json_format.MessageToDict(out[3].dynamic_metadata)["tokenweir"]["settle_tokens"]
    assert running == int(hb["x-tokenweir-reserve"]) - 256 + 1


async def test_unknown_key_gets_401_immediately(policy: Policy, services: Services) -> None:
    out = await drive(servicer_for(policy, services), "chat-completions",
                      [headers_msg({**BASE, "authorization": "Bearer wrong-key-123"})])  # fmt: skip
    assert len(out) == 1
    imm = out[0].immediate_response
    assert imm.status.code == 401
    assert json.loads(imm.body)["error"]["code"] == "invalid_api_key"


async def test_unknown_route_is_503_and_bodyless_requests_still_get_descriptors(
    policy: Policy, services: Services
) -> None:
    s = servicer_for(policy, services)
    out = await drive(s, "nope", [headers_msg(BASE)])
    assert out[0].immediate_response.status.code == 503
    get = {":method": "GET", ":path": "/v1/models", "authorization": "Bearer tw-demo-pro-key"}
    out = await drive(s, "chat-completions", [headers_msg(get, eos=True)])
    hs = set_headers(out[0].request_headers.response)
    assert hs["x-tokenweir-reserve"] == "0" and hs["x-tokenweir-tenant"] == "demo-pro"
    assert hs["x-tokenweir-lane"] == "interactive" and hs["x-tokenweir-model"] == "llama-3.1-8b"


async def test_bad_body_is_400_then_next_request_is_served(
    policy: Policy, services: Services
) -> None:
    s = servicer_for(policy, services)
    auth = {**BASE, "authorization": "Bearer tw-demo-pro-key"}
    bad = await drive(s, "chat-completions", [
        headers_msg(auth), pb.ProcessingRequest(request_body=pb.HttpBody(body=b"{oops", end_of_stream=True))])  # fmt: skip
    assert bad[1].immediate_response.status.code == 400
    ok_body = b'{"model":"llama-3.1-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":3}'
    good = await drive(s, "chat-completions", [
        headers_msg(auth), pb.ProcessingRequest(request_body=pb.HttpBody(body=ok_body, end_of_stream=True))])  # fmt: skip
    assert good[1].WhichOneof("response") == "request_body"
    assert (
        services.metrics.registry.get_sample_value(
            "tokenweir_filters_rejections_total",
            {"route": "chat-completions", "reason": "bad_json", "status": "400"},
        )
        == 1
    )
