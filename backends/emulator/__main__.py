"""``python -m backends.emulator`` / ``tokenweir-emulator``: one emulated SGLang server process."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence

from backends.emulator.app import start_emulator
from backends.emulator.disagg import add_disagg_args, disagg_config
from backends.emulator.lora_config import add_lora_args, lora_config
from backends.emulator.priority import DEFAULT_PREEMPTION_THRESHOLD, PriorityConfig
from backends.emulator.settings import EmulatorSettings
from backends.profiles import profile_names
from chat.tokenizer import TokenizerFilesError
from prefixindex.errors import KvEventsConfigError
from prefixindex.wire import KvEventsConfig

__all__ = ["main", "parse_args"]


def parse_args(argv: Sequence[str] | None = None) -> EmulatorSettings:
    p = argparse.ArgumentParser(
        prog="tokenweir-emulator",
        description="A CPU emulator of an SGLang server (same HTTP API and metric names).",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument(
        "--model", "--model-path", "--served-model-name", default="emulated-model",
        dest="model", help="served model name",
    )  # fmt: skip
    p.add_argument("--profile", default="llama-3.1-8b-h100", choices=profile_names())
    p.add_argument(
        "--time-scale", type=float, default=1.0, help="multiply emulated durations (0.01: 100x)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--max-queued-requests", type=int)
    p.add_argument(
        "--cache-tokens", "--max-total-tokens", type=int, dest="cache_tokens",
        help="KV pool / radix cache size in tokens",
    )  # fmt: skip
    p.add_argument("--page-size", type=int)
    p.add_argument("--chunked-prefill-size", type=int)
    p.add_argument("--context-length", type=int)
    p.add_argument("--default-max-tokens", type=int, default=128)
    p.add_argument(
        "--embedding-dim", type=int, default=256, help="floats per /v1/embeddings vector"
    )
    p.add_argument("--stop-prob", type=float, default=0.0, help="per-token EOS chance")
    p.add_argument("--no-cache-report", action="store_true", help="omit cached_tokens in usage")
    p.add_argument("--error-rate", type=float, default=0.0)
    p.add_argument("--hang-rate", type=float, default=0.0)
    p.add_argument("--slow", type=float, default=1.0, help="step time multiplier (>= 1)")
    p.add_argument("--slow-start", type=float, default=0.0, help="seconds of 503 after start")
    p.add_argument("--log-level", default="INFO")
    p.add_argument(
        "--flavor", choices=("sglang", "vllm"), default="sglang",
        help="present itself as SGLang or as vLLM: metric names, endpoints, KV-event fields "
        "(docs/emulator.md)",
    )  # fmt: skip
    vl = p.add_argument_group("vLLM's names for the same settings (with --flavor vllm)")
    vl.add_argument("--max-num-seqs", type=int, dest="max_running_requests")
    vl.add_argument("--block-size", type=int, dest="page_size")
    p.add_argument(
        "--kv-events-config",
        help='SGLang\'s KV-event publisher as JSON, e.g. \'{"publisher": "zmq", "endpoint": '
        '"tcp://*:5557", "replay_endpoint": "tcp://*:5558"}\' (docs/emulator.md)',
    )
    p.add_argument(
        "--tokenizer-path",
        metavar="DIR",
        help="a model directory (tokenizer.json, tokenizer_config.json / chat_template.jinja): "
        "prompts are rendered and tokenized as SGLang does for that model (docs/emulator.md)",
    )
    p.add_argument(
        "--disconnect-check",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="a non-streamed request whose client went is aborted only at the next check, "
        "every SECONDS of its run (SGLang: 4); 0 (default): at once",
    )
    p.add_argument(
        "--request-log",
        metavar="PATH",
        help="append a JSON line per finished request (id, queue, TTFT, tokens) to PATH",
    )
    p.add_argument(
        "--enable-trace", action="store_true", help="export a span per request over OTLP (SGLang)"
    )
    p.add_argument(
        "--otlp-traces-endpoint", default="localhost:4317", help="OTLP/gRPC collector host:port"
    )
    pr = p.add_argument_group("priority scheduling (SGLang's flags and defaults)")
    pr.add_argument("--enable-priority-scheduling", action="store_true")
    pr.add_argument("--schedule-low-priority-values-first", action="store_true")
    pr.add_argument(
        "--priority-scheduling-preemption-threshold", type=int, default=DEFAULT_PREEMPTION_THRESHOLD
    )
    pr.add_argument("--abort-on-priority-when-disabled", action="store_true")
    add_disagg_args(p)
    add_lora_args(p)
    sg = p.add_argument_group("accepted for command-line compatibility with sglang.launch_server")
    sg.add_argument("--enable-metrics", action="store_true", help="always on")
    sg.add_argument(
        "--enable-cache-report", action="store_true", help="on unless --no-cache-report"
    )
    sg.add_argument("--schedule-policy", default="fcfs", help="the emulator schedules FCFS")
    sg.add_argument("--mem-fraction-static", type=float, help="ignored (use --cache-tokens)")
    sg.add_argument("--tp-size", type=int, help="ignored")
    a = p.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    try:
        kv_events = KvEventsConfig.from_json(a.kv_events_config) if a.kv_events_config else None
    except KvEventsConfigError as exc:
        p.error(f"--kv-events-config: {exc}")
    try:
        return EmulatorSettings(
            model=a.model,
            profile=a.profile,
            host=a.host,
            port=a.port,
            time_scale=a.time_scale,
            seed=a.seed,
            max_running_requests=a.max_running_requests,
            max_queued_requests=a.max_queued_requests,
            cache_tokens=a.cache_tokens,
            page_size=a.page_size,
            chunked_prefill_size=a.chunked_prefill_size,
            context_length=a.context_length,
            default_max_tokens=a.default_max_tokens,
            embedding_dim=a.embedding_dim,
            stop_prob=a.stop_prob,
            enable_cache_report=not a.no_cache_report,
            error_rate=a.error_rate,
            hang_rate=a.hang_rate,
            slow_factor=a.slow,
            slow_start_s=a.slow_start,
            exit_on_crash=True,
            kv_events=kv_events,
            request_log=a.request_log,
            disconnect_check=a.disconnect_check,
            tokenizer_path=a.tokenizer_path,
            enable_trace=a.enable_trace,
            otlp_traces_endpoint=a.otlp_traces_endpoint,
            flavor=a.flavor,
            disaggregation=disagg_config(a),
            lora=lora_config(a),
            priority=PriorityConfig(
                enabled=a.enable_priority_scheduling,
                low_values_first=a.schedule_low_priority_values_first,
                preemption_threshold=a.priority_scheduling_preemption_threshold,
                abort_when_disabled=a.abort_on_priority_when_disabled,
            ),
        )
    except ValueError as exc:
        p.error(str(exc))
        raise  # unreachable: p.error exits


async def _serve(settings: EmulatorSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = await start_emulator(settings)
    log = logging.getLogger("backends.emulator")
    log.info(
        "emulator %s (profile %s, time scale %g) listening on %s",
        settings.model,
        server.profile.name,
        settings.time_scale,
        server.url,
    )
    try:
        await stop.wait()
    finally:
        log.info("emulator stopping")
        await server.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_args(argv)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency, but optional at runtime
        run: Callable[[Coroutine[object, None, None]], None] = asyncio.run
    else:
        run = uvloop.run
    try:
        with contextlib.suppress(KeyboardInterrupt):
            run(_serve(settings))
    except TokenizerFilesError as exc:
        print(f"emulator: --tokenizer-path: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
