"""Full governance path (ext_proc filters + rate limit + Redis) vs Envoy alone, in one run.

One gateway Envoy (1 worker, static config rendered by our translation) serves both paths side by
side: ``/plain/...`` goes straight to the backend, ``/v1/...`` runs every plugin and the
token-aware rate limit, ``/f/v1/...`` runs the plugins without the rate limit, ``/py/v1/...``
is the full path with ``usage_meter: python`` (each response chunk through ext_proc, as before
Envoy's Lua usage meter) beside ``/v1/`` (the Lua meter), and ``/s/`` vs ``/sp/`` the same for
streams, with the CPU per streamed request of every process. The backend for
requests/s is an Envoy answering with a canned completion (so the backend is not the bottleneck);
the streaming backend writes its wall time into every chunk, so the per-chunk delay the path adds
can be measured. k6 drives the requests/s phases, alternating plain and full; a Python client
measures streams. Results: JSON in bench/results/filters_bench_p<N>.json and a table on stdout.

``.venv/bin/python bench/filters_bench.py [--seconds 10] [--vus 16] [--filter-procs 1]
[--transport grpc|h2|both]``: with ``both`` every round runs the three paths once per transport of
the filter server (the process is restarted on the same port between them), so both transports
are measured side by side against the same Envoy-alone runs. ``--baseline DIR`` (a source tree of
older code, e.g. ``git archive <commit>``) instead runs both services once from DIR ("old") and
once from this tree ("new") in every round, on the h2 transport: old vs new in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controlplane.translate.render import render  # noqa: E402
from controlplane.translate.static import static_bootstrap  # noqa: E402
from policy import load_policy  # noqa: E402
from tests.helpers import ChildProcess, free_port, redis_server, wait_for_port  # noqa: E402
from tokenweir.envoy_launcher import envoy_binary  # noqa: E402

KEY = "bench-key-123"
BODY = {"model": "m1", "messages": [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Summarize the history of weirs on European rivers."}],
        "max_tokens": 16}  # fmt: skip
CANNED = {"id": "c1", "object": "chat.completion", "model": "m1",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 30, "completion_tokens": 1, "total_tokens": 31}}  # fmt: skip
K6_SCRIPT = """
import http from 'k6/http';
const body = open(__ENV.BODY_FILE);
const params = {headers: {'content-type': 'application/json', 'authorization': 'Bearer ' + __ENV.KEY}};
export default function () { http.post(__ENV.URL, body, params); }
"""


def policy_text(
    gw: int, fp: int, rp: int, redis_port: int, canned: int, sse: int, procs: int
) -> str:
    full = "rate_limit: {enabled: true}\n        filters: {plugins: [identity, tokens, prefix, lane, usage]}"
    full_py = full[:-1] + ", usage_meter: python}"  # every response chunk through ext_proc
    return f"""
version: 1
control_plane: {{xds: 127.0.0.1:1, metrics: 127.0.0.1:2}}
ratelimit: {{address: 127.0.0.1:{rp}, timeout: 1s, redis_url: "redis://127.0.0.1:{redis_port}/0"}}
filters: {{address: 127.0.0.1:{fp}, message_timeout: 1s, processes: {procs}}}
pools:
  chat: {{models: [m1], endpoints: [127.0.0.1:{canned}], health_check: {{enabled: false}}, retries: {{enabled: false}}}}
  stream: {{models: [m1], endpoints: [127.0.0.1:{sse}], health_check: {{enabled: false}}, retries: {{enabled: false}}}}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes:
      - {{name: plain, match: {{prefix: /plain/}}, pool: chat}}
      - {{name: plain-stream, match: {{prefix: /ps/}}, pool: stream}}
      - name: full-stream
        match: {{prefix: /s/}}
        pool: stream
        {full}
      - name: full-stream-python
        match: {{prefix: /sp/}}
        pool: stream
        {full_py}
      - name: full-python
        match: {{prefix: /py/}}
        pool: chat
        {full_py}
      - name: filters-only
        match: {{prefix: /f/}}
        pool: chat
        filters: {{plugins: [identity, tokens, prefix, lane, usage]}}
      - name: full
        match: {{prefix: /v1/}}
        pool: chat
        {full}
tiers:
  big: {{max_tokens: 4096, quotas: {{tokens: {{burst: 1000000000, refill_per_second: 1000000000}}}}}}
tenants:
  bench: {{tier: big, api_keys: [{KEY}]}}
"""


def canned_bootstrap(port: int) -> dict[str, Any]:
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "canned",
        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [{
            "match": {"prefix": "/"},
            "direct_response": {"status": 200, "body": {"inline_string": json.dumps(CANNED)}},
            "response_headers_to_add": [{"header": {"key": "content-type", "value": "application/json"}}],
        }]}]},
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
    }  # fmt: skip
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": free_port()}}},
        "static_resources": {"listeners": [{
            "name": "canned",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}],
        }]},
    }  # fmt: skip


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """user + system CPU seconds so far of each process group (a child and its workers)."""
    out = dict.fromkeys(pids, 0.0)
    groups = {pid: name for name, pid in pids.items()}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = groups.get(int(fields[2]))  # the process group id
        if name is not None:
            out[name] += (int(fields[11]) + int(fields[12])) / 100.0  # utime, stime (ticks)
    return out


def k6(
    url: str, seconds: int, vus: int, tmp: Path, pids: dict[str, int] | None = None
) -> dict[str, float]:
    script, body, out = tmp / "load.js", tmp / "body.json", tmp / "k6.json"
    script.write_text(K6_SCRIPT)
    body.write_text(json.dumps(BODY))
    before = cpu_seconds(pids or {})
    subprocess.run(
        [str(Path(sys.executable).parent / "k6"), "run", "--quiet", "--no-color", "--address", f"127.0.0.1:{free_port()}",
         "--vus", str(vus), "--duration", f"{seconds}s", "--summary-trend-stats", "med,p(99)",
         "--summary-export", str(out), "-e", f"URL={url}", "-e", f"KEY={KEY}", "-e", f"BODY_FILE={body}", str(script)],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    m = json.loads(out.read_text())["metrics"]
    failed = m.get("http_req_failed", {}).get("value", 0.0)
    after = cpu_seconds(pids or {})
    count = m["http_reqs"]["count"]
    cpu = {f"cpu_ms_per_req_{k}": (after[k] - before[k]) * 1000 / count for k in after}
    return {
        **cpu,
        "rps": m["http_reqs"]["rate"],
        "p50_ms": m["http_req_duration"]["med"],
        "p99_ms": m["http_req_duration"]["p(99)"],
        "failed": failed,
    }


async def streams(url: str, n: int, concurrency: int, chunks: int) -> dict[str, Any]:
    """Per-chunk delay (arrival − backend write time) and time to first chunk, in ms."""
    delays: list[float] = []
    ttft: list[float] = []
    body = {**BODY, "stream": True, "max_tokens": chunks}
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    sem = asyncio.Semaphore(concurrency)

    async def one(s: aiohttp.ClientSession) -> None:
        async with sem:
            t0 = time.time()
            first = True
            async with s.post(url, json=body, headers=headers) as r:
                assert r.status == 200, await r.text()
                buf = b""
                async for data in r.content.iter_any():
                    now = time.time()
                    buf += data
                    while b"\n\n" in buf:
                        ev, buf = buf.split(b"\n\n", 1)
                        if b'"ts"' in ev:
                            obj = json.loads(ev[6:])
                            delays.append((now - obj["ts"]) * 1000)
                            if first:
                                ttft.append((now - t0) * 1000)
                                first = False

    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(one(s) for _ in range(n)))
    q = statistics.quantiles(delays, n=100)
    return {"chunks": len(delays), "chunk_p50_ms": q[49], "chunk_p99_ms": q[98],
            "ttft_p50_ms": statistics.median(ttft)}  # fmt: skip


async def run(ns: argparse.Namespace) -> dict[str, Any]:
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="tw-bench-") as d, redis_server() as redis_port:
        tmp = Path(d)
        gw, fp, rp, canned, sse = (free_port() for _ in range(5))
        policy = tmp / "mesh.yaml"
        policy.write_text(policy_text(gw, fp, rp, redis_port, canned, sse, ns.filter_procs))
        (tmp / "canned.json").write_text(json.dumps(canned_bootstrap(canned)))
        boot = static_bootstrap(render(load_policy(policy))["edge"], admin_port=free_port())
        if (
            ns.filter_procs > 1
        ):  # several connections to the filter server, so SO_REUSEPORT spreads them
            for c in boot["static_resources"]["clusters"]:
                if c["name"] == "tokenweir_filters":
                    opts = c["typedExtensionProtocolOptions"][
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
                    ]
                    opts["explicitHttpConfig"]["http2ProtocolOptions"]["maxConcurrentStreams"] = (
                        ns.streams_per_connection
                    )
        (tmp / "edge.json").write_text(json.dumps(boot))
        envoy = str(envoy_binary())
        base = 7000 + (gw % 500) * 2
        argvs = {
            "canned": [envoy, "-c", str(tmp / "canned.json"), "--base-id", str(base), "--concurrency", "1", "-l", "error"],
            "edge": [envoy, "-c", str(tmp / "edge.json"), "--base-id", str(base + 1), "--concurrency", "1", "-l", "error"],
            "sse": [py, str(ROOT / "bench" / "filters_sse_backend.py"), "--port", str(sse), "--gap", str(ns.gap)],
        }  # fmt: skip
        rls_argv = ["ratelimit_service", "--policy", str(policy)]
        filters_argv = ["filters", "--policy", str(policy), "--log-level", "WARNING"]
        transports = ["grpc", "h2"] if ns.transport == "both" else [ns.transport]
        trees = {t: ROOT for t in transports}
        if ns.baseline is not None:  # old code vs this tree, both services, h2 transport
            transports, trees = ["old", "new"], {"old": ns.baseline.resolve(), "new": ROOT}
        children = [ChildProcess(a, log=tmp / f"{k}.log") for k, a in argvs.items()]
        filters: list[ChildProcess] = []

        def from_tree(tree: Path, argv: list[str]) -> list[str]:
            """``python -m argv[0] …`` with ``tree`` first on sys.path (old vs new code)."""
            boot = f"import sys,runpy; sys.path.insert(0, {str(tree)!r}); sys.argv[1:] = {argv[1:]!r}; runpy.run_module({argv[0]!r}, run_name='__main__', alter_sys=True)"  # fmt: skip
            return [py, "-c", boot]

        def start_filters(label: str) -> None:
            for c in filters:
                c.close()
            transport = "h2" if label in ("old", "new") else label
            tr_args = ["--transport", transport]
            filters[:] = [
                ChildProcess(from_tree(trees[label], rls_argv), log=tmp / f"rls-{label}.log"),
                ChildProcess(from_tree(trees[label], [*filters_argv, *tr_args]), log=tmp / f"filters-{label}.log"),
            ]  # fmt: skip
            wait_for_port(fp, 30)
            wait_for_port(rp, 30)
            pids["ratelimit"], pids["filters"] = (c.proc.pid for c in filters)

        try:
            for port in (canned, gw, sse):
                wait_for_port(port, 30)
            pids = {k: c.proc.pid for k, c in zip(argvs, children, strict=True) if k != "sse"}
            start_filters(transports[0])
            await asyncio.sleep(1.0)
            res: dict[str, Any] = {
                "vus": ns.vus,
                "seconds": ns.seconds,
                "filter_procs": ns.filter_procs,
                "transports": transports,
                "loadavg_before": os.getloadavg(),
            }
            url = f"http://127.0.0.1:{gw}"
            k6(url + "/v1/chat/completions", 2, ns.vus, tmp)  # warm-up
            for _ in range(ns.rounds):
                for tr in transports:
                    if len(transports) > 1:
                        start_filters(tr)
                        k6(url + "/v1/chat/completions", 1, ns.vus, tmp)  # warm-up
                    for name, path in (("envoy_alone", "/plain/v1/chat/completions"),
                                       ("full_path", "/v1/chat/completions"),
                                       ("full_path_python", "/py/v1/chat/completions"),
                                       ("filters_only", "/f/v1/chat/completions")):  # fmt: skip
                        key = name if len(transports) == 1 else f"{name}@{tr}"
                        res.setdefault(key, []).append(
                            k6(url + path, ns.seconds, ns.vus, tmp, pids)
                        )
            for tr in transports:
                if len(transports) > 1:
                    start_filters(tr)
                for name, path in (("stream_envoy_alone", "/ps/v1/chat/completions"),
                                   ("stream_full_path", "/s/v1/chat/completions"),
                                   ("stream_full_path_python", "/sp/v1/chat/completions")):  # fmt: skip
                    key = name if len(transports) == 1 else f"{name}@{tr}"
                    await streams(url + path, 10, ns.streams, ns.chunks)  # warm-up
                    before = cpu_seconds(pids)
                    res[key] = await streams(url + path, ns.stream_requests, ns.streams, ns.chunks)
                    after = cpu_seconds(pids)
                    for k in after:  # CPU per streamed request, per process
                        res[key][f"cpu_ms_per_stream_{k}"] = (
                            (after[k] - before[k]) * 1000 / ns.stream_requests
                        )
            res["loadavg_after"] = os.getloadavg()
            if ns.diag:
                admin = boot["admin"]["address"]["socket_address"]["port_value"]
                stats = (
                    urllib.request.urlopen(
                        f"http://127.0.0.1:{admin}/stats?usedonly&filter=(ratelimit|ext_proc|tokenweir|pool_chat)"
                    )
                    .read()
                    .decode()
                )
                print(stats)
            return res
        finally:
            for c in [*filters, *children]:
                c.close()


def summarize(res: dict[str, Any], suffix: str = "") -> dict[str, float]:
    def mean(name: str, key: str) -> float:
        return statistics.mean(r[key] for r in res[name + suffix])

    def cpu(name: str) -> float:
        return statistics.mean(r.get("cpu_ms_per_req_filters", 0.0) for r in res[name + suffix])

    def median_ratio(name: str) -> float:  # per round, against that round's Envoy alone
        pairs = zip(res[name + suffix], res["envoy_alone" + suffix], strict=True)
        return statistics.median(r["rps"] / e["rps"] for r, e in pairs)

    a, f, fo = (mean(n, "rps") for n in ("envoy_alone", "full_path", "filters_only"))
    fpy = mean("full_path_python", "rps")
    sa, sf = res["stream_envoy_alone" + suffix], res["stream_full_path" + suffix]
    return {
        "filters_cpu_ms_per_req_full": cpu("full_path"),
        "filters_cpu_ms_per_req_filters_only": cpu("filters_only"),
        "envoy_alone_rps": a, "full_path_rps": f, "filters_only_rps": fo,
        "full_over_alone": f / a, "filters_only_over_alone": fo / a,
        "full_python_meter_over_alone": fpy / a,
        "full_python_meter_over_alone_median": median_ratio("full_path_python"),
        "full_over_alone_median": median_ratio("full_path"),
        "filters_only_over_alone_median": median_ratio("filters_only"),
        "filters_cpu_ms_per_req_full_median": statistics.median(r.get("cpu_ms_per_req_filters", 0.0) for r in res["full_path" + suffix]),
        "ratelimit_cpu_ms_per_req_full_median": statistics.median(r.get("cpu_ms_per_req_ratelimit", 0.0) for r in res["full_path" + suffix]),
        "added_p50_ms": mean("full_path", "p50_ms") - mean("envoy_alone", "p50_ms"),
        "added_p99_ms": mean("full_path", "p99_ms") - mean("envoy_alone", "p99_ms"),
        "added_chunk_p50_ms": sf["chunk_p50_ms"] - sa["chunk_p50_ms"],
        "added_chunk_p99_ms": sf["chunk_p99_ms"] - sa["chunk_p99_ms"],
        "added_ttft_p50_ms": sf["ttft_p50_ms"] - sa["ttft_p50_ms"],
        "failed_fraction_max": max(r["failed"] for n in ("envoy_alone", "full_path", "filters_only") for r in res[n + suffix]),
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--vus", type=int, default=16)
    p.add_argument("--filter-procs", type=int, default=1)
    p.add_argument("--streams-per-connection", type=int, default=4, help="with --filter-procs > 1")
    p.add_argument("--streams", type=int, default=8, help="concurrent streams")
    p.add_argument("--stream-requests", type=int, default=80)
    p.add_argument("--chunks", type=int, default=50)
    p.add_argument("--gap", type=float, default=0.005, help="seconds between backend chunks")
    p.add_argument("--diag", action="store_true", help="print the gateway's Envoy stats")
    p.add_argument("--transport", choices=("grpc", "h2", "both"), default="grpc",
                   help="the filter server's transport; both: side by side")  # fmt: skip
    p.add_argument(
        "--out", type=Path, default=None, help="default: bench/results/filters_bench_p<N>.json"
    )
    p.add_argument("--baseline", type=Path, default=None,
                   help="a source tree of the old code: old vs new (h2), interleaved per round")  # fmt: skip
    ns = p.parse_args()
    if ns.out is None:
        tr = "_old_new" if ns.baseline else "" if ns.transport == "grpc" else f"_{ns.transport}"
        ns.out = ROOT / "bench" / "results" / f"filters_bench_p{ns.filter_procs}{tr}.json"
    res = asyncio.run(run(ns))
    suffixes = [""] if len(res["transports"]) == 1 else [f"@{t}" for t in res["transports"]]
    res["summary"] = {s or ns.transport: summarize(res, s) for s in suffixes}
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(res, indent=2))
    names = list(res["summary"])
    print(f"{'':36s}" + "".join(f"{n:>12s}" for n in names))
    for k in res["summary"][names[0]]:
        print(f"{k:36s}" + "".join(f"{res['summary'][n][k]:12.3f}" for n in names))
    print("load average before/after:", res["loadavg_before"], res["loadavg_after"])
    for sfx in suffixes:
        for name in ("stream_envoy_alone", "stream_full_path", "stream_full_path_python"):
            cpu = {k[len("cpu_ms_per_stream_") :]: round(v, 3)
                   for k, v in res[name + sfx].items() if k.startswith("cpu_ms")}  # fmt: skip
            print(f"cpu ms/stream {name + sfx:24s} {cpu}")
        for name in ("envoy_alone", "full_path", "full_path_python", "filters_only"):
            cpu = {
                k[len("cpu_ms_per_req_") :]: round(v, 3)
                for k, v in res[name + sfx][-1].items()
                if k.startswith("cpu_ms")
            }
            print(f"cpu ms/request {name + sfx:20s} {cpu}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
