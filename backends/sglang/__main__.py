"""``python -m backends.sglang``: run one SGLang replica for a pool until SIGTERM/SIGINT.

Example (GPU host)::

    python -m backends.sglang --model-path Qwen/Qwen2.5-0.5B-Instruct --port 30001 \\
        --pool-file /var/lib/tokenweir/pools/chat.endpoints --max-running-requests 64
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from backends.errors import LauncherError
from backends.sglang.launcher import LaunchConfig, SGLangLauncher

__all__ = ["main", "parse_args"]

log = logging.getLogger("backends.sglang")


def parse_args(argv: Sequence[str] | None = None) -> LaunchConfig:
    p = argparse.ArgumentParser(
        prog="python -m backends.sglang", description=__doc__.split("\n")[0]
    )
    p.add_argument("--model-path", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--pool-file", type=Path, required=True, help="endpoint file to register in")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--advertise-host", help="host written to the pool file (default --host)")
    p.add_argument("--served-model-name")
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--max-queued-requests", type=int)
    p.add_argument("--schedule-policy", default="fcfs")
    p.add_argument("--chunked-prefill-size", type=int)
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--max-total-tokens", type=int)
    p.add_argument("--page-size", type=int)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument(
        "--kv-events-port", type=int,
        help="publish KV-cache events (ZMQ PUB on tcp://*:PORT; docs/emulator.md)",
    )  # fmt: skip
    p.add_argument("--kv-events-replay-port", type=int, help="serve event replays on this port")
    p.add_argument("--enable-priority-scheduling", action="store_true")
    p.add_argument("--priority-scheduling-preemption-threshold", type=int)
    p.add_argument("--schedule-low-priority-values-first", action="store_true")
    p.add_argument("--server-module", default="sglang.launch_server")
    p.add_argument("--health-timeout", type=float, default=900.0)
    p.add_argument("--drain-timeout", type=float, default=60.0)
    p.add_argument("--log-file", type=Path)
    p.add_argument("extra", nargs="*", help="more flags for the server, after --")
    a = p.parse_args(argv)
    return LaunchConfig(
        model_path=a.model_path,
        port=a.port,
        pool_file=a.pool_file,
        host=a.host,
        advertise_host=a.advertise_host,
        served_model_name=a.served_model_name,
        max_running_requests=a.max_running_requests,
        max_queued_requests=a.max_queued_requests,
        schedule_policy=a.schedule_policy,
        chunked_prefill_size=a.chunked_prefill_size,
        mem_fraction_static=a.mem_fraction_static,
        max_total_tokens=a.max_total_tokens,
        page_size=a.page_size,
        tp_size=a.tp_size,
        kv_events_port=a.kv_events_port,
        kv_events_replay_port=a.kv_events_replay_port,
        enable_priority_scheduling=a.enable_priority_scheduling,
        priority_scheduling_preemption_threshold=a.priority_scheduling_preemption_threshold,
        schedule_low_priority_values_first=a.schedule_low_priority_values_first,
        extra_args=tuple(a.extra),
        server_module=a.server_module,
        health_timeout_s=a.health_timeout,
        drain_timeout_s=a.drain_timeout,
        log_file=a.log_file,
    )


async def _run(cfg: LaunchConfig) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    launcher = SGLangLauncher(cfg)
    try:
        hints = await launcher.start()
    except LauncherError as exc:
        log.error("launch failed: %s", exc)
        return 1
    log.info(
        "registered %s in %s; capacity %s", cfg.endpoint, cfg.pool_file, json.dumps(hints.to_json())
    )
    exited = asyncio.ensure_future(launcher.wait())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        log.info("draining and stopping %s", cfg.endpoint)
        await launcher.aclose()
        exited.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await exited
    return 0 if stop.is_set() else 1


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    return asyncio.run(_run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
