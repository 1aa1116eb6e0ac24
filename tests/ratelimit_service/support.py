"""Shared by the rate-limit integration tests and benchmarks: policies, a static Envoy bootstrap
that uses the control plane's ratelimit translation, and service processes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict

from controlplane.translate.ratelimit import ratelimit_http_filter, ratelimit_per_route
from policy.model import Route, RouteRateLimit
from tests.helpers import ChildProcess, free_port, static_cluster, wait_for_port

ROOT = Path(__file__).resolve().parents[2]

# A Lua filter stands in for the filter server: on the response it copies the backend's
# x-usage-tokens header into dynamic metadata tokenweir.settle_tokens (what the usage plugin does).
USAGE_LUA = """
function envoy_on_response(handle)
  local usage = handle:headers():get("x-usage-tokens")
  if usage ~= nil then
    handle:streamInfo():dynamicMetadata():set("tokenweir", "settle_tokens", tonumber(usage))
  end
end
"""


def start_service(
    policy: Path,
    redis_url: str,
    port: int,
    tmp: Path,
    *,
    name: str = "rls",
    extra: list[str] | None = None,
) -> ChildProcess:
    argv = [
        sys.executable,
        "-m",
        "ratelimit_service",
        "--policy",
        str(policy),
        "--redis-url",
        redis_url,
        "--listen",
        f"127.0.0.1:{port}",
        *(extra or []),
    ]
    child = ChildProcess(argv, log=tmp / f"{name}.log", env={"PYTHONPATH": str(ROOT)})
    try:
        wait_for_port(port, timeout=20)
    except TimeoutError:
        child.close()
        raise RuntimeError(child.output()) from None
    return child


def _route(prefix: str, route: Route, cluster: str) -> dict[str, Any]:
    per = {k: MessageToDict(v) for k, v in ratelimit_per_route(route).items()}
    r: dict[str, Any] = {
        "match": {"prefix": prefix},
        "route": {"cluster": cluster, "timeout": "0s"},
    }
    if per:
        r["typed_per_filter_config"] = per
    return r


def envoy_bootstrap(
    policy: Any, *, listen: int, admin: int, backend: int, rls: int
) -> dict[str, Any]:
    """Static config: Lua usage stand-in → ratelimit (our translation) → router."""
    llm = Route(name="chat", pool="chat", rate_limit=RouteRateLimit())
    svc = Route(name="inventory", service="inventory", rate_limit=RouteRateLimit())
    free = Route(name="free", pool="chat")
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "edge",
        "route_config": {
            "name": "local",
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [
                        _route("/v1/", llm, "backend"),
                        _route("/inventory/", svc, "backend"),
                        _route("/", free, "backend"),
                    ],
                }
            ],
        },
        "http_filters": [
            {
                "name": "envoy.filters.http.lua",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                    "default_source_code": {"inline_string": USAGE_LUA},
                },
            },
            MessageToDict(ratelimit_http_filter(policy), preserving_proto_field_name=True),
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            },
        ],
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "edge",
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
                }
            ],
            "clusters": [
                static_cluster("backend", backend),
                static_cluster("tokenweir_ratelimit", rls, {}),
            ],
        },
    }


def start_envoy(bootstrap_path: Path, admin: int, tmp: Path) -> ChildProcess:
    base_id = 20_000 + os.getpid() % 10_000
    argv = [
        str(Path(sys.executable).parent / "envoy"),
        "-c",
        str(bootstrap_path),
        "--base-id",
        str(base_id),
        "--concurrency",
        "1",
        "-l",
        "warning",
        "--disable-hot-restart",
    ]
    child = ChildProcess(argv, log=tmp / "envoy.log")
    try:
        wait_for_port(admin, timeout=30)
        _wait_live(admin, timeout=30)
    except TimeoutError:
        child.close()
        raise RuntimeError(child.output()) from None
    return child


def _wait_live(admin: int, timeout: float) -> None:
    """Until Envoy's admin ``/ready`` answers 200 (LIVE: its listeners are up). The admin port
    opens first; a loaded box once saw the test's first request refused in between."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:  # not LIVE yet (503), or the admin port busy
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"Envoy (admin {admin}) not LIVE after {timeout:g} s")
        time.sleep(0.05)


@contextlib.contextmanager
def redis_cluster(masters: int = 3, replicas: int = 0) -> Iterator[list[int]]:
    """A real local Redis Cluster (``masters`` primaries, ``replicas`` replicas of each); yields
    the ports of every node (``redis-cli`` picks which are primaries: ask CLUSTER NODES)."""
    nodes = masters * (1 + replicas)
    ports: list[int] = []
    while len(ports) < 2 * nodes:  # a client port and a cluster-bus port per node
        p = free_port()
        if p not in ports:
            ports.append(p)
    buses, ports = ports[nodes:], ports[:nodes]
    children: list[ChildProcess] = []
    with tempfile.TemporaryDirectory(prefix="tw-cluster-") as tmp:
        try:
            for p, bus in zip(ports, buses, strict=True):
                d = Path(tmp) / str(p)
                d.mkdir()
                argv = [
                    "redis-server",
                    "--port",
                    str(p),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(d),
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                    "--cluster-port",
                    str(bus),
                ]
                children.append(ChildProcess(argv, log=d / "redis.log"))
            for p in ports:
                wait_for_port(p)
            created = subprocess.run(
                [
                    "redis-cli",
                    "--cluster",
                    "create",
                    *(f"127.0.0.1:{p}" for p in ports),
                    "--cluster-replicas",
                    str(replicas),
                    "--cluster-yes",
                ],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if created.returncode != 0:
                raise RuntimeError(
                    f"redis-cli --cluster create failed: {created.stdout}{created.stderr}"
                )
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                out = subprocess.run(
                    ["redis-cli", "-p", str(ports[0]), "cluster", "info"],
                    capture_output=True,
                    text=True,
                ).stdout
                if "cluster_state:ok" in out:
                    break
                time.sleep(0.1)
            else:
                raise RuntimeError("redis cluster did not reach cluster_state:ok")
            yield ports
        finally:
            for c in children:
                c.close()


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus text-format metric's samples whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total
