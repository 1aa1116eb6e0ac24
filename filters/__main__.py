"""``python -m filters --policy PATH [--redis-url URL]``: run the ext_proc filter server.

Reads its listen address and settings from the policy (``filters:``), serves /metrics on the
policy's ``metrics_port`` or ``--metrics-port`` (worker i on port + i), reloads the policy when
the file changes. ``--processes N`` (default: the policy's ``filters.processes``) runs N
processes on one port (SO_REUSEPORT) under :class:`runtime.supervisor.WorkerSupervisor`: the
kernel spreads Envoy's connections over them, so it pays only with several connections.
SIGTERM or Ctrl-C drains (NOT_SERVING, no new streams, streams in flight finish within
``--drain-timeout``, default the policy's ``filters.drain_timeout``) and exits. ``--instances N``:
N filter servers run side by side behind the same Envoys (default the policy's
``replicas.filters``); each process admits its share of a pool's capacity (docs/policy.md,
``admission.gateways``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from policy import PolicyError, load_policy
from runtime.errors import PlaintextRefused
from runtime.process import run, serve
from runtime.supervisor import WorkerSupervisor

__all__ = ["main"]


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m filters", description=__doc__)
    p.add_argument("--policy", required=True, type=Path, help="the mesh policy YAML")
    p.add_argument(
        "--redis-url",
        default=os.environ.get("TOKENWEIR_REDIS_URL"),
        help="Redis for live API keys and budgets (default: $TOKENWEIR_REDIS_URL, else the "
        "policy's; a URL with a password belongs in the environment, not the command line)",
    )
    p.add_argument("--listen", help="host:port (default: the policy's filters.address)")
    p.add_argument("--metrics-port", type=int, help="Prometheus /metrics port")
    p.add_argument("--tokenizer", help="a Hugging Face tokenizer.json for exact token counts")
    p.add_argument("--processes", type=int, help="processes sharing the port")
    p.add_argument(
        "--drain-timeout", type=float, help="seconds streams in flight may finish on shutdown"
    )
    p.add_argument(
        "--transport",
        choices=("h2", "grpc"),
        default="h2",
        help="h2 (default): the built-in HTTP/2 server, ~half the CPU per stream; grpc: grpc.aio",
    )
    p.add_argument(
        "--instances",
        type=int,
        help="filter servers side by side behind the same Envoys (default: the policy's "
        "replicas.filters; `tokenweir up --replicas filters=N` passes it): each admits its "
        "share of a pool's capacity",
    )
    p.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    # a worker's processes of its server, all together (a worker itself runs with --processes 1)
    p.add_argument("--server-processes", type=int, help=argparse.SUPPRESS)
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    ns = _args(args)
    logging.basicConfig(
        level=ns.log_level.upper(),
        format=f"%(asctime)s filters[{ns.worker_index}] %(levelname)s %(name)s: %(message)s",
    )
    try:
        policy = load_policy(ns.policy)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 2
    section = policy.filters
    processes = ns.processes or (section.processes if section is not None else 1)
    drain = ns.drain_timeout
    if drain is None:
        drain = section.drain_timeout if section is not None else 30.0
    workers = None
    if ns.worker_index == 0 and processes > 1:
        base = [sys.executable, "-m", "filters", *args]
        together = ["--server-processes", str(processes)]
        workers = WorkerSupervisor(
            "filters",
            lambda i: [*base, *together, "--worker-index", str(i), "--processes", "1"],
            processes,
        )
    from filters.app import FilterApp, Settings
    from filters.plugins.admission.limits import gateway_processes

    settings = Settings(
        policy_path=ns.policy,
        redis_url=ns.redis_url,
        listen=ns.listen,
        metrics_port=ns.metrics_port,
        tokenizer_file=ns.tokenizer,
        worker_index=ns.worker_index,
        transport=ns.transport,
        local_processes=gateway_processes(policy, ns.instances, ns.server_processes or processes),
    )
    app = FilterApp(settings, clock=time.monotonic)
    try:
        return run(serve(app, drain_timeout=drain, workers=workers))
    except PlaintextRefused as exc:  # a clear start-up error, no traceback
        print(exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
