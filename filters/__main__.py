"""``python -m filters --policy PATH [--redis-url URL]``: run the ext_proc filter server.

Reads its listen address and settings from the policy (``filters:``), serves /metrics on the
policy's ``metrics_port`` or ``--metrics-port`` (worker i on port + i), reloads the policy when
the file changes, stops cleanly on SIGTERM/SIGINT. ``--processes N`` (default: the policy's
``filters.processes``) runs N processes on one port (SO_REUSEPORT): the kernel spreads Envoy's
connections over them, so it pays only with several connections (several Envoy workers or
Envoys, or a ``max_concurrent_streams`` on the ``tokenweir_filters`` cluster).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

from controlplane.children import die_with_parent

__all__ = ["main"]


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m filters", description=__doc__)
    p.add_argument("--policy", required=True, type=Path, help="the mesh policy YAML")
    p.add_argument("--redis-url", help="Redis for live API keys and budgets (default: policy)")
    p.add_argument("--listen", help="host:port (default: the policy's filters.address)")
    p.add_argument("--metrics-port", type=int, help="Prometheus /metrics port")
    p.add_argument("--tokenizer", help="a Hugging Face tokenizer.json for exact token counts")
    p.add_argument("--processes", type=int, help="processes sharing the port")
    p.add_argument(
        "--transport",
        choices=("h2", "grpc"),
        default="h2",
        help="h2 (default): the built-in HTTP/2 server, ~half the CPU per stream; grpc: grpc.aio",
    )
    p.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


async def _run(ns: argparse.Namespace, children: list[subprocess.Popen[bytes]]) -> None:
    from filters.app import FilterApp, Settings

    settings = Settings(
        policy_path=ns.policy,
        redis_url=ns.redis_url,
        listen=ns.listen,
        metrics_port=ns.metrics_port,
        tokenizer_file=ns.tokenizer,
        worker_index=ns.worker_index,
        transport=ns.transport,
    )
    app = FilterApp(settings, clock=time.monotonic)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await app.start()
    try:
        await stop.wait()
    finally:
        for child in children:
            child.terminate()
        await app.aclose()
        for child in children:
            try:
                await asyncio.to_thread(child.wait, 5.0)
            except subprocess.TimeoutExpired:
                child.kill()


def main(argv: list[str] | None = None) -> int:
    ns = _args(argv)
    logging.basicConfig(
        level=ns.log_level.upper(),
        format=f"%(asctime)s filters[{ns.worker_index}] %(levelname)s %(name)s: %(message)s",
    )
    processes = ns.processes
    if processes is None:
        from controlplane.policy import PolicyError, load_policy

        try:
            policy = load_policy(ns.policy)
        except PolicyError as exc:
            print(exc, file=sys.stderr)
            return 2
        processes = policy.filters.processes if policy.filters is not None else 1
    children: list[subprocess.Popen[bytes]] = []
    if ns.worker_index == 0 and processes > 1:
        base = [sys.executable, "-m", "filters", *(argv if argv is not None else sys.argv[1:])]
        for i in range(1, processes):
            children.append(
                subprocess.Popen(
                    [*base, "--worker-index", str(i), "--processes", str(processes)],
                    preexec_fn=die_with_parent,  # no worker outlives a killed parent
                )
            )
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover - uvloop is a dependency
        runner = asyncio.Runner()
    with runner:
        runner.run(_run(ns, children))
    return 0


if __name__ == "__main__":
    sys.exit(main())
