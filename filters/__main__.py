"""``python -m filters --policy PATH [--redis-url URL]``: run the ext_proc filter server."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import time
from pathlib import Path

__all__ = ["main"]


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m filters", description=__doc__)
    p.add_argument("--policy", required=True, type=Path, help="the mesh policy YAML")
    p.add_argument("--redis-url", help="Redis for live API keys and budgets (default: policy)")
    p.add_argument("--listen", help="host:port (default: the policy's filters.address)")
    p.add_argument("--metrics-port", type=int, help="Prometheus /metrics port")
    p.add_argument("--tokenizer", help="a Hugging Face tokenizer.json for exact token counts")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


async def _run(ns: argparse.Namespace) -> None:
    from filters.app import FilterApp, Settings

    settings = Settings(
        policy_path=ns.policy,
        redis_url=ns.redis_url,
        listen=ns.listen,
        metrics_port=ns.metrics_port,
        tokenizer_file=ns.tokenizer,
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
        await app.aclose()


def main(argv: list[str] | None = None) -> int:
    ns = _args(argv)
    logging.basicConfig(
        level=ns.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        uvloop = None  # type: ignore[assignment]
    with contextlib.suppress(KeyboardInterrupt):
        if uvloop is not None:
            uvloop.run(_run(ns))
        else:
            asyncio.run(_run(ns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
