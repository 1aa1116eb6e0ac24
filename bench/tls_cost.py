"""What HTTPS at the gateway costs: the same Envoy route over plain HTTP and over TLS, side by side.

One control plane (in this process) and two gateway Envoys (1 worker each) built from one policy:
``plain`` (HTTP) and ``tls`` (TLS 1.2+, ALPN, certificates by SDS), both to one streaming
backend (bench/filters_sse_backend.py), with no filter server or rate limit on the path, so the
difference is TLS. k6 measures requests/s with keep-alive connections and with a new connection
(a full handshake) per request, alternating plain and TLS for ``--rounds`` rounds; a Python
client measures the time to the first streamed chunk (TTFT added by the gateway), on one
keep-alive connection and on a new connection per request. Results: JSON in
bench/results/tls_cost.json and a table on stdout.

``.venv/bin/python bench/tls_cost.py [--seconds 8] [--vus 16] [--rounds 2] [--streams 200]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controlplane.app import ControlPlane, ControlPlaneSettings  # noqa: E402
from controlplane.tls_material import make_ca, make_cert  # noqa: E402
from policy import Address  # noqa: E402
from tests.helpers import ChildProcess, free_port, wait_for_port  # noqa: E402
from tokenweir.envoy_launcher import EnvoyProcess, EnvoySettings  # noqa: E402

BODY = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
K6_SCRIPT = """
import http from 'k6/http';
export const options = {insecureSkipTLSVerify: true, noConnectionReuse: __ENV.FRESH === '1'};
const body = open(__ENV.BODY_FILE);
const params = {headers: {'content-type': 'application/json'}};
export default function () { http.post(__ENV.URL, body, params); }
"""


def policy(backend: int, plain: int, tls: int, cert: Path, key: Path, sds: Path) -> str:
    route = "routes: [{name: chat, pool: chat}]\n    access_log: {enabled: false}"
    return f"""
version: 1
pools:
  chat: {{models: [m1], endpoints: [127.0.0.1:{backend}], health_check: {{enabled: false}}}}
gateways:
  plain:
    listen: 127.0.0.1:{plain}
    {route}
  tls:
    listen: 127.0.0.1:{tls}
    {route}
    tls: {{certificates: [{{cert: {cert}, key: {key}}}], sds_dir: {sds}}}
"""


def k6(url: str, seconds: int, vus: int, tmp: Path, fresh: bool) -> dict[str, float]:
    script, body, out = tmp / "load.js", tmp / "body.json", tmp / "k6.json"
    script.write_text(K6_SCRIPT)
    body.write_text(json.dumps(BODY))
    subprocess.run(
        [str(Path(sys.executable).parent / "k6"), "run", "--quiet", "--no-color",
         "--address", f"127.0.0.1:{free_port()}", "--vus", str(vus), "--duration", f"{seconds}s",
         "--summary-trend-stats", "med,p(99)", "--summary-export", str(out), "-e", f"URL={url}",
         "-e", f"BODY_FILE={body}", "-e", f"FRESH={int(fresh)}", str(script)],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    m = json.loads(out.read_text())["metrics"]
    return {
        "rps": m["http_reqs"]["rate"],
        "p50_ms": m["http_req_duration"]["med"],
        "failed": m.get("http_req_failed", {}).get("value", 0.0),
    }


async def ttft(url: str, n: int, ctx: ssl.SSLContext | None, fresh: bool) -> float:
    """Median ms from sending a streamed request to its first chunk."""
    times: list[float] = []
    body = {**BODY, "stream": True}
    connector = aiohttp.TCPConnector(force_close=fresh, ssl=ctx if ctx is not None else False)
    async with aiohttp.ClientSession(connector=connector) as s:
        for _ in range(n):
            t0 = time.perf_counter()
            async with s.post(url, json=body) as r:
                assert r.status == 200, await r.text()
                await r.content.readany()
                times.append((time.perf_counter() - t0) * 1000)
                await r.read()
    return statistics.median(times)


async def run(ns: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="tls-cost-"))
    ca = make_ca(tmp / "ca")
    cert = make_cert(tmp / "live", "gateway", ca, dns=("localhost",), ips=("127.0.0.1",))
    backend, plain, tls = free_port(), free_port(), free_port()
    sse = ChildProcess(
        [sys.executable, str(ROOT / "bench/filters_sse_backend.py"), "--port", str(backend),
         "--gap", "0"],
        log=tmp / "backend.log",
    )  # fmt: skip
    path = tmp / "mesh.yaml"
    path.write_text(policy(backend, plain, tls, cert.cert, cert.key, tmp / "sds"))
    plane = ControlPlane(
        ControlPlaneSettings(
            path, Address("127.0.0.1", free_port()), Address("127.0.0.1", free_port())
        )
    )
    envoys: list[EnvoyProcess] = []
    try:
        wait_for_port(backend)
        result = await plane.start()
        assert result.ok, result.problems
        for i, node in enumerate(("plain", "tls")):
            env = EnvoyProcess(
                EnvoySettings(node_id=node, node_cluster=node, xds_port=plane.xds_port,
                              base_id=7300 + i, delta=True),
                tmp / f"envoy-{node}",
            )  # fmt: skip
            await env.start()
            envoys.append(env)
        for port in (plain, tls):
            wait_for_port(port)
        urls = {
            "plain": f"http://127.0.0.1:{plain}/v1/chat/completions",
            "tls": f"https://127.0.0.1:{tls}/v1/chat/completions",
        }
        client = ssl.create_default_context(cafile=str(ca.cert))
        client.set_alpn_protocols(["http/1.1"])
        rounds: list[dict[str, Any]] = []
        for _ in range(ns.rounds):
            row: dict[str, Any] = {}
            for fresh in (False, True):
                for arm, url in urls.items():
                    row[f"{arm}_{'fresh' if fresh else 'keepalive'}"] = k6(
                        url, ns.seconds, ns.vus, tmp, fresh
                    )
            for fresh in (False, True):
                for arm, url in urls.items():
                    ctx = client if arm == "tls" else None
                    key = f"ttft_{arm}_{'fresh' if fresh else 'keepalive'}_ms"
                    row[key] = await ttft(url, ns.streams, ctx, fresh)
            rounds.append(row)
        return {"rounds": rounds, "seconds": ns.seconds, "vus": ns.vus, "streams": ns.streams}
    finally:
        for env in envoys:
            await env.aclose()
        await plane.aclose()
        sse.close()


def summarize(res: dict[str, Any]) -> dict[str, float]:
    rows = res["rounds"]
    out: dict[str, float] = {}
    for conn in ("keepalive", "fresh"):
        p = [r[f"plain_{conn}"]["rps"] for r in rows]
        t = [r[f"tls_{conn}"]["rps"] for r in rows]
        out[f"rps_plain_{conn}"] = statistics.median(p)
        out[f"rps_tls_{conn}"] = statistics.median(t)
        out[f"rps_ratio_{conn}"] = statistics.median(b / a for a, b in zip(p, t, strict=True))
        pt = statistics.median(r[f"ttft_plain_{conn}_ms"] for r in rows)
        tt = statistics.median(r[f"ttft_tls_{conn}_ms"] for r in rows)
        out[f"ttft_plain_{conn}_ms"], out[f"ttft_tls_{conn}_ms"] = pt, tt
        out[f"ttft_added_{conn}_ms"] = tt - pt
        out[f"failed_{conn}"] = max(
            r[f"{a}_{conn}"]["failed"] for r in rows for a in ("plain", "tls")
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--vus", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/tls_cost.json")
    ns = ap.parse_args()
    res = asyncio.run(run(ns))
    res["summary"] = summarize(res)
    ns.out.write_text(json.dumps(res, indent=2) + "\n")
    for k, v in res["summary"].items():
        print(f"{k:<28} {v:10.2f}")


if __name__ == "__main__":
    main()
