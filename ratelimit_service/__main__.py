"""``python -m ratelimit_service --policy PATH --redis-url URL``: the entry point.

Reads the listen address and settings from the policy (``ratelimit:``), serves /metrics on the
policy's ``metrics_port`` (or ``--metrics-port``; worker i uses port + i) and reloads the policy
when the file changes. ``--processes N`` (default: the policy's ``ratelimit.replicas``) runs N
processes sharing the gRPC port (SO_REUSEPORT) under :class:`runtime.supervisor.WorkerSupervisor`.
SIGTERM or Ctrl-C drains (NOT_SERVING, no new calls, calls in flight finish within
``--drain-timeout``, default the policy's ``ratelimit.drain_timeout``) and exits.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from policy import PolicyError, load_policy
from ratelimit_service.server import Service, ServiceSettings
from runtime.errors import PlaintextRefused
from runtime.process import run, serve
from runtime.supervisor import WorkerSupervisor

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ratelimit_service", description=__doc__)
    p.add_argument("--policy", required=True, type=Path, help="the mesh policy (YAML)")
    p.add_argument(
        "--redis-url",
        default=os.environ.get("TOKENWEIR_REDIS_URL"),
        help="redis://[user:password@]host:port/db or rediss:// (TLS); ?cluster=1 forces "
        "cluster (default: $TOKENWEIR_REDIS_URL, else the policy's)",
    )
    p.add_argument("--listen", default=None, help="host:port (default: policy ratelimit.address)")
    p.add_argument("--metrics-port", type=int, default=None)
    p.add_argument("--processes", type=int, default=None, help="processes sharing the port")
    p.add_argument(
        "--drain-timeout", type=float, help="seconds calls in flight may finish on shutdown"
    )
    p.add_argument(
        "--transport",
        choices=["h2", "grpc"],
        default="h2",
        help="h2: the built-in HTTP/2 gRPC server (one method, ~4x less CPU per call); grpc: grpc.aio",
    )
    p.add_argument(
        "--instances",
        type=int,
        default=None,
        help="services side by side (default: the policy's replicas.ratelimit): sizes the "
        "local fallback bucket",
    )
    p.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s ratelimit[{args.worker_index}] %(levelname)s %(name)s: %(message)s",
    )
    try:
        policy = load_policy(args.policy, gateway_files=False)  # not the gateway's key
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 2
    rl = policy.ratelimit
    processes = args.processes or (rl.replicas if rl else 1)
    drain = args.drain_timeout
    if drain is None:
        drain = rl.drain_timeout if rl is not None else 30.0
    settings = ServiceSettings(
        policy_path=args.policy,
        redis_url=args.redis_url,
        listen=args.listen,
        metrics_port=args.metrics_port,
        worker_index=args.worker_index,
        transport=args.transport,
        instances=args.instances,
    )
    workers = None
    if args.worker_index == 0 and processes > 1:
        base = [sys.executable, "-m", "ratelimit_service", *argv]
        workers = WorkerSupervisor(
            "ratelimit",
            lambda i: [*base, "--worker-index", str(i), "--processes", "1"],
            processes,
        )
    service = Service(settings, policy)
    try:
        return run(serve(service, drain_timeout=drain, workers=workers))
    except PlaintextRefused as exc:  # a clear start-up error, no traceback
        print(exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
