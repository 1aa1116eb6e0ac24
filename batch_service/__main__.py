"""``python -m batch_service api|runner``: the batch API server or one batch runner.

    python -m batch_service api --policy mesh.yaml --listen 127.0.0.1:18070 \\
        --redis-url redis://... --files-dir DIR
    python -m batch_service runner --policy mesh.yaml --index 0 --redis-url ... --files-dir DIR

In Kubernetes (deploy/kubernetes/base/batch.yaml) the API listens beyond loopback with its
``/metrics`` apart (``--metrics-port``, behind the admin token), and a runner reaches the
gateway and the control plane by their Services (``--gateway-url``, ``--control-plane``).

``tokenweir up`` starts both (docs/batch.md). Ends on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

from batch_service.api import ApiSettings, BatchApi, served_endpoints
from batch_service.files import DirectoryStore
from batch_service.records import Records
from batch_service.runner import BatchRunner, RunnerSettings
from policy import Address, Policy
from policy.batch import BatchPolicy
from policy.errors import PolicyError
from policy.loader import load_policy
from poolstate.reader import PoolStateReader, pools_url
from runtime.admin_auth import admin_token
from runtime.metrics_http import MetricsServer
from runtime.redis_connect import connect_redis
from runtime.tasks import stop_task

__all__ = ["main"]


def _gateway_url(policy: Policy, name: str) -> str:
    """The gateway's own listener, over TLS when it has ``tls`` (its SNI names are the host's
    business: give --gateway-url and --gateway-ca where the certificate names another host)."""
    gw = policy.gateways[name]
    scheme = "https" if gw.tls is not None else "http"
    return f"{scheme}://{gw.listen.host}:{gw.listen.port}"


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m batch_service", description=__doc__)
    p.add_argument("role", choices=["api", "runner"])
    p.add_argument("--policy", required=True, type=Path, help="the mesh policy YAML")
    p.add_argument(
        "--redis-url",
        default=os.environ.get("TOKENWEIR_REDIS_URL"),
        help="Redis of the mesh (default: $TOKENWEIR_REDIS_URL, else ratelimit.redis_url)",
    )
    p.add_argument("--files-dir", type=Path, help="the file store (default: batch.files_dir)")
    p.add_argument("--listen", help="api: host:port (default: the batch service's first endpoint)")
    p.add_argument("--index", type=int, default=0, help="runner: replica index")
    p.add_argument(
        "--metrics-port", type=int,
        help="runner: /metrics port (default: policy); api: serve /metrics on this port apart "
        "(then the API may listen beyond loopback: only the gateway should reach it)",
    )  # fmt: skip
    p.add_argument(
        "--metrics-host", default="127.0.0.1",
        help="where /metrics listens (beyond loopback: needs the admin token, runtime.admin_auth)",
    )  # fmt: skip
    p.add_argument(
        "--gateway-url",
        help="runner: http(s)://host:port of the gateway (default: its listen, over TLS when "
        "the gateway has tls)",
    )
    p.add_argument(
        "--gateway-ca", type=Path,
        help="runner: CA bundle the gateway's certificate chains to (default: the system's)",
    )  # fmt: skip
    p.add_argument(
        "--control-plane", help="runner: host:port of the control plane's metrics (pool state)"
    )
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


async def _until_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _api(ns: argparse.Namespace, policy: Policy, b: BatchPolicy, records: Records) -> None:
    listen = Address.parse(ns.listen) if ns.listen else policy.services[b.service].endpoints[0]
    models = frozenset(m for p in policy.pools.values() for m in p.models)
    registry = CollectorRegistry()
    api = BatchApi(
        ApiSettings(b, models, served_endpoints(policy)), records, DirectoryStore(_files_dir(ns, b)),
        clock=time.time, registry=registry,
    )  # fmt: skip
    if ns.metrics_port is None:  # one port, loopback only (as `up` runs it)
        server = MetricsServer(registry, listen.host, listen.port, routes=api.routes())
        await server.start()
        logging.getLogger("tokenweir.batch").info("batch API on http://%s", listen)
        try:
            await _until_signal()
        finally:
            await server.aclose()
        return
    # the API on its own port (the gateway authenticates its callers), /metrics apart
    metrics = MetricsServer(
        registry, ns.metrics_host, ns.metrics_port, token=admin_token(os.environ)
    )
    await metrics.start()
    app = web.Application()
    app.router.add_get("/healthz", _ok)
    app.add_routes(api.routes())
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, listen.host, listen.port).start()
        logging.getLogger("tokenweir.batch").info("batch API on http://%s", listen)
        await _until_signal()
    finally:
        await runner.cleanup()
        await metrics.aclose()


async def _ok(_request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def _runner(ns: argparse.Namespace, policy: Policy, b: BatchPolicy, records: Records) -> None:
    cp = Address.parse(ns.control_plane) if ns.control_plane else policy.control_plane.metrics
    token = admin_token(os.environ)
    reader = PoolStateReader(pools_url(cp.host, cp.port), clock=time.monotonic, token=token)
    reader.start()
    registry = CollectorRegistry()
    consumer = f"{socket.gethostname()}-{ns.index}"  # a restarted runner takes back its own jobs
    runner = BatchRunner(
        RunnerSettings(
            b, ns.gateway_url or _gateway_url(policy, b.gateway), consumer,
            gateway_ca=ns.gateway_ca, lane_share=policy.admission.lane("batch").max_share,
        ),
        records, DirectoryStore(_files_dir(ns, b)), reader,
        clock=time.time, registry=registry,
    )  # fmt: skip
    port = ns.metrics_port or b.runner.metrics_port + ns.index
    metrics = MetricsServer(registry, ns.metrics_host, port, token=token)
    await metrics.start()
    task = asyncio.create_task(runner.run(), name="tokenweir-batch-runner")
    try:
        await _until_signal()
    finally:
        await stop_task(task)  # lines in flight are sent again by whoever takes the job
        await reader.aclose()
        await metrics.aclose()


def _files_dir(ns: argparse.Namespace, b: BatchPolicy) -> Path:
    if ns.files_dir is not None:
        return Path(ns.files_dir)
    base = ns.policy.resolve().parent
    if b.files_dir is not None:
        return base / os.path.expanduser(b.files_dir)
    return base / ".tokenweir" / "state" / "batch-files"


async def _main(ns: argparse.Namespace, policy: Policy, b: BatchPolicy) -> None:
    url = ns.redis_url or (policy.ratelimit.redis_url if policy.ratelimit else None)
    if url is None:
        raise SystemExit("the batch service needs Redis: --redis-url or ratelimit.redis_url")
    redis = await connect_redis(url, timeout=2.0)
    try:
        records = Records(redis)
        await (_api if ns.role == "api" else _runner)(ns, policy, b, records)
    finally:
        await redis.aclose()


def main(argv: list[str] | None = None) -> int:
    ns = _args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=ns.log_level.upper(),
        format=f"%(asctime)s batch-{ns.role}[{ns.index}] %(levelname)s %(name)s: %(message)s",
    )
    try:
        policy = load_policy(ns.policy)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 2
    if policy.batch is None:
        print(f"{ns.policy}: no batch section (docs/batch.md)", file=sys.stderr)
        return 2
    asyncio.run(_main(ns, policy, policy.batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
