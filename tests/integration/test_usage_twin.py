"""The two usage meters, driven with the same streams: Envoy's Lua meter (real Envoy, the code the
control plane renders) and the Python usage plugin (kept for routes whose other plugins read the
response body). Same settlement (tokens and micro-USD), same bytes to the client, chunk by chunk
as the backend wrote them (usage split across chunks, the usage event cut when not asked, errors,
JSON answers, SGLang /generate)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from controlplane.translate.usage_meter import lua_source
from filters.bodies import parse_request
from filters.plugins.usage.plugin import UsagePlugin
from filters.sse import SETTLE_KEY
from policy import load_policy
from tests.filters.conftest import ROOT, FakeClock, make_ctx, make_services
from tests.filters.test_usage import run
from tests.helpers import ChildProcess, envoy_base_id, free_port, wait_for_port

pytestmark = pytest.mark.timeout(120)

MODEL = "llama-3.1-8b"
PRICE = load_policy(ROOT / "examples" / "mesh.yaml").prices[MODEL]


def ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


USAGE = {"prompt_tokens": 31, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 8}}
ROLE = ev({"choices": [{"delta": {"role": "assistant", "content": ""}}], "usage": None})
TOKENS = [ev({"choices": [{"delta": {"content": w}}], "usage": None}) for w in ("a", "b", "c")]
FINISH = ev({"choices": [{"delta": {}, "finish_reason": "stop"}], "usage": None})
ONLY_USAGE = ev({"choices": [], "usage": USAGE})
DONE = b"data: [DONE]\n\n"
WHOLE = [ROLE, *TOKENS, FINISH, ONLY_USAGE, DONE]
SPLIT = [ROLE, *TOKENS, FINISH + ONLY_USAGE[:40], ONLY_USAGE[40:-7], ONLY_USAGE[-7:] + DONE]
WORD_SPLIT = [ROLE, TOKENS[0], ONLY_USAGE[:34] + b"", ONLY_USAGE[34:] + DONE]  # "us|age"
NO_USAGE = [ROLE, *TOKENS, FINISH, DONE]  # the backend never reports: the estimate stays
JSON_OK = [json.dumps({"choices": [{"message": {"content": "hi"}}], "usage": USAGE}).encode()]
JSON_ERR = [b'{"object":"error","message":"boom","type":"Bad Request","code":400}']
EMB_USAGE = {"prompt_tokens": 12, "total_tokens": 12}  # an embeddings answer: no completion
EMB = [json.dumps({"object": "list", "data": [{"object": "embedding", "embedding": [0.6, 0.8],
                   "index": 0}], "model": MODEL, "usage": EMB_USAGE}).encode()]  # fmt: skip
GEN = [
    b"data: " + json.dumps({"text": "a" * i, "meta_info": {"prompt_tokens": 9,
                            "completion_tokens": i, "cached_tokens": 0}}).encode() + b"\n\n"
    for i in (1, 2, 3)
] + [DONE]  # fmt: skip

# name: (chunks, stream, client asked for usage, kind, status)
CASES: dict[str, tuple[list[bytes], bool, bool, str, int]] = {
    "whole_cut": (WHOLE, True, False, "chat", 200),
    "whole_kept": (WHOLE, True, True, "chat", 200),
    "split_cut": (SPLIT, True, False, "chat", 200),
    "split_kept": (SPLIT, True, True, "chat", 200),
    "word_split_cut": (WORD_SPLIT, True, False, "chat", 200),
    "no_usage": (NO_USAGE, True, False, "chat", 200),
    "json": (JSON_OK, False, False, "chat", 200),
    "json_error": (JSON_ERR, False, False, "chat", 400),
    "generate": (GEN, True, False, "generate", 200),
    "embeddings": (EMB, False, False, "embedding", 200),
}
PROMPT, MAX_TOKENS, RESERVE = 30, 2, 99

INPUTS = """
function envoy_on_request(h)
  local md, hd = h:streamInfo():dynamicMetadata(), h:headers()
  md:set("tokenweir", "meter", true)
  md:set("tokenweir", "settle_tokens", 0) -- as the filter server does at the request
  for _, k in ipairs({"prompt", "max_tokens", "reserve", "price_prompt", "price_cached",
                      "price_completion"}) do
    md:set("tokenweir", k, tonumber(hd:get("x-twin-" .. k)))
  end
  md:set("tokenweir", "stream", hd:get("x-twin-stream") == "1")
  md:set("tokenweir", "cut", hd:get("x-twin-cut") == "1")
end
"""


def _lua(name: str, code: str) -> dict[str, Any]:
    return {
        "name": name,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
            "default_source_code": {"inline_string": code},
        },
    }


def bootstrap(port: int, admin: int, backend: int, log: Path) -> dict[str, Any]:
    fields = {k: f"%DYNAMIC_METADATA(tokenweir:{k})%" for k in
              ("settle_tokens", "settle_usd_micros", "outcome", "timing")}  # fmt: skip
    fields["case"] = "%REQ(x-twin-case)%"
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager"
        ".v3.HttpConnectionManager",
        "stat_prefix": "twin",
        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
            {"match": {"prefix": "/"}, "route": {"cluster": "backend", "timeout": "0s"}}]}]},
        "http_filters": [
            _lua("inputs", INPUTS),
            _lua("envoy.filters.http.lua", lua_source()),
            {"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
        ],
        "access_log": [{"name": "file", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": str(log), "log_format": {"json_format": fields}}}],
    }  # fmt: skip

    def addr(p: int) -> dict[str, Any]:
        return {"socket_address": {"address": "127.0.0.1", "port_value": p}}

    return {
        "admin": {"address": addr(admin)},
        "static_resources": {
            "listeners": [{"name": "l", "address": addr(port), "filter_chains": [{"filters": [
                {"name": "hcm", "typed_config": hcm}]}]}],
            "clusters": [{"name": "backend", "type": "STATIC", "connect_timeout": "1s",
                          "load_assignment": {"cluster_name": "backend", "endpoints": [
                              {"lb_endpoints": [{"endpoint": {"address": addr(backend)}}]}]}}],
        },
    }  # fmt: skip


async def _serve(request: web.Request) -> web.StreamResponse:
    chunks, stream, _, _, status = CASES[request.match_info["case"]]
    ctype = "text/event-stream" if stream and status < 400 else "application/json"
    resp = web.StreamResponse(status=status, headers={"content-type": ctype})
    await resp.prepare(request)
    for c in chunks:
        await resp.write(c)
        await asyncio.sleep(0.03)  # one write, one chunk at Envoy
    await resp.write_eof()
    return resp


@pytest.fixture
async def envoy(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    app = web.Application()
    app.router.add_post("/{case}", _serve)
    runner = web.AppRunner(app)
    await runner.setup()
    backend = free_port()
    await web.TCPSite(runner, "127.0.0.1", backend).start()
    port, admin, log = free_port(), free_port(), tmp_path / "access.log"
    path = tmp_path / "bootstrap.json"
    path.write_text(json.dumps(bootstrap(port, admin, backend, log)))
    argv = [str(Path(sys.executable).parent / "envoy"), "-c", str(path), "--concurrency", "1",
            "--base-id", str(envoy_base_id()), "--disable-hot-restart",
            "-l", "warning", "--file-flush-interval-msec", "50"]  # fmt: skip
    child = ChildProcess(argv, log=tmp_path / "envoy.log")
    wait_for_port(admin, timeout=30)
    wait_for_port(port, timeout=30)
    try:
        yield f"http://127.0.0.1:{port}", log
    finally:
        child.close()
        await runner.cleanup()


async def _python(case: str) -> tuple[bytes, dict[str, Any]]:
    chunks, stream, wants, kind, _ = CASES[case]
    clock = FakeClock()
    services = make_services(load_policy(ROOT / "examples" / "mesh.yaml"), clock)
    plugin = UsagePlugin({}, services)
    body: dict[str, Any] = {"model": MODEL, "stream": stream}
    if kind == "chat":
        body.update(messages=[{"role": "user", "content": "x"}], max_tokens=MAX_TOKENS)
    elif kind == "embedding":
        body = {"model": MODEL, "input": "x"}
    else:
        body.update(text="x", sampling_params={"max_new_tokens": MAX_TOKENS})
    paths = {"chat": "/v1/chat/completions", "embedding": "/v1/embeddings"}
    ctx = make_ctx(path=paths.get(kind, "/generate"), model=MODEL)
    ctx.body = parse_request(kind, json.dumps(body).encode())
    ctx.stream, ctx.client_wants_usage = stream, wants
    ctx.prompt_tokens, ctx.max_tokens, ctx.reserve = PROMPT, MAX_TOKENS, RESERVE
    out, meta = await run(plugin, ctx, chunks, clock)
    inputs = plugin.envoy_inputs(ctx)
    return out, {**meta, "inputs": inputs}


async def _envoy(url: str, case: str, inputs: dict[str, Any]) -> bytes:
    headers = {"x-twin-case": case, "x-twin-stream": "1" if inputs["stream"] else "0",
               "x-twin-cut": "1" if inputs["cut"] else "0"}  # fmt: skip
    for k in (
        "prompt",
        "max_tokens",
        "reserve",
        "price_prompt",
        "price_cached",
        "price_completion",
    ):
        headers[f"x-twin-{k}"] = repr(inputs[k])
    async with aiohttp.ClientSession() as s, s.post(f"{url}/{case}", headers=headers) as r:
        return await r.read()


async def _logged(log: Path, case: str) -> dict[str, Any]:
    for _ in range(100):
        if log.exists():
            for line in log.read_text().splitlines():
                row = json.loads(line)
                if row["case"] == case:
                    return row  # type: ignore[no-any-return]
        await asyncio.sleep(0.05)
    raise AssertionError(f"no access log line for {case}")


@pytest.mark.parametrize("case", list(CASES))
async def test_lua_and_python_meters_agree(envoy: tuple[str, Path], case: str) -> None:
    url, log = envoy
    want_bytes, meta = await _python(case)
    got_bytes = await _envoy(url, case, meta["inputs"])
    row = await _logged(log, case)
    assert got_bytes == want_bytes
    assert row["settle_tokens"] == meta.get(SETTLE_KEY, 0)
    assert row["settle_usd_micros"] == meta.get("settle_usd_micros", None)
    if case == "embeddings":  # settled from usage.prompt_tokens, not the reservation
        assert row["settle_tokens"] == 12 != RESERVE


async def test_the_usage_event_is_cut_when_not_asked_and_kept_when_asked(
    envoy: tuple[str, Path],
) -> None:
    url, log = envoy
    for case, kept in (("split_cut", False), ("split_kept", True)):
        _, meta = await _python(case)
        body = await _envoy(url, case, meta["inputs"])
        assert (b'"choices": [], "usage"' in body) is kept, body
        assert body.endswith(DONE) and body.count(b"data:") == len(WHOLE) - (0 if kept else 1)
        row = await _logged(log, case)
        assert row["settle_tokens"] == 34 and row["outcome"] == "ok"  # the backend's report
        usd = ((31 - 8) * PRICE.prompt + 8 * PRICE.cached + 3 * PRICE.completion) / 1000
        assert (
            int(row["settle_usd_micros"]) > 0 and abs(int(row["settle_usd_micros"]) - usd * 1e6) < 1
        )
        assert int(row["timing"].split(",")[0]) == len(SPLIT)


async def test_an_error_answer_settles_zero(envoy: tuple[str, Path]) -> None:
    url, log = envoy
    _, meta = await _python("json_error")
    await _envoy(url, "json_error", meta["inputs"])
    row = await _logged(log, "json_error")
    assert row["outcome"] == "error" and row["settle_tokens"] in (None, 0)
