"""``python -m ratelimit_service --policy PATH --redis-url URL``: the entry point.

Reads the listen address and settings from the policy (``ratelimit:``), serves /metrics on the
policy's ``metrics_port`` (or ``--metrics-port``; worker i uses port + i), reloads the policy when
the file changes and stops cleanly on SIGTERM/SIGINT. ``--processes N`` (default: the policy's
``ratelimit.replicas``) runs N processes sharing the gRPC port (SO_REUSEPORT).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import subprocess
import sys
from pathlib import Path

from controlplane.children import die_with_parent
from controlplane.policy import PolicyError, load_policy
from ratelimit_service.server import Service, ServiceSettings

__all__ = ["main"]

log = logging.getLogger("ratelimit_service")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ratelimit_service", description=__doc__)
    p.add_argument("--policy", required=True, type=Path, help="the mesh policy (YAML)")
    p.add_argument(
        "--redis-url", default=None, help="redis://host:port/db (?cluster=1 forces cluster)"
    )
    p.add_argument("--listen", default=None, help="host:port (default: policy ratelimit.address)")
    p.add_argument("--metrics-port", type=int, default=None)
    p.add_argument("--processes", type=int, default=None, help="processes sharing the port")
    p.add_argument(
        "--transport",
        choices=["h2", "grpc"],
        default="h2",
        help="h2: the built-in HTTP/2 gRPC server (one method, ~4x less CPU per call); grpc: grpc.aio",
    )
    p.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--log-level", default="INFO")
    return p


async def _serve(settings: ServiceSettings, children: list[subprocess.Popen[bytes]]) -> None:
    policy = load_policy(settings.policy_path)
    service = Service(settings, policy)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await service.start()
    print(
        f"ratelimit_service worker {settings.worker_index} listening on port {service.port}",
        flush=True,
    )
    try:
        await stop.wait()
    finally:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                child.terminate()
        await service.aclose()
        for child in children:
            try:
                await asyncio.to_thread(child.wait, 5.0)
            except subprocess.TimeoutExpired:
                child.kill()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s ratelimit[{args.worker_index}] %(levelname)s %(name)s: %(message)s",
    )
    try:
        policy = load_policy(args.policy)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 2
    processes = args.processes or (policy.ratelimit.replicas if policy.ratelimit else 1)
    settings = ServiceSettings(
        policy_path=args.policy,
        redis_url=args.redis_url,
        listen=args.listen,
        metrics_port=args.metrics_port,
        worker_index=args.worker_index,
        transport=args.transport,
    )
    children: list[subprocess.Popen[bytes]] = []
    if args.worker_index == 0 and processes > 1:
        base = [
            sys.executable,
            "-m",
            "ratelimit_service",
            *(argv if argv is not None else sys.argv[1:]),
        ]
        for i in range(1, processes):
            children.append(
                subprocess.Popen(
                    [*base, "--worker-index", str(i), "--processes", "1"],
                    preexec_fn=die_with_parent,  # no worker outlives a killed parent
                )
            )
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        runner.run(_serve(settings, children))
    return 0


if __name__ == "__main__":
    sys.exit(main())
