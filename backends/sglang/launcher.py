"""Launch one real SGLang server for a governed pool, register it, drain and remove it.

Lifecycle of ``SGLangLauncher``:

1. ``start()``: run ``python -m sglang.launch_server`` with the flags a governed pool needs
   (``build_command``; with ``kv_events_port`` also ``--kv-events-config`` so the server
   publishes its KV-cache events on ``tcp://*:PORT``, replay on ``kv_events_replay_port``), in
   its own process group; poll ``/health`` until 200 (the server answers
   503 while loading); read capacity hints from ``/get_server_info``; add ``host:port`` to the
   pool's endpoint file and the hints (with the KV-event addresses a subscriber connects to) to
   ``<pool file>.capacity.json``.
2. ``aclose()``: drain first: remove the endpoint (the control plane stops routing to it), wait
   until ``sglang:num_running_reqs`` + ``sglang:num_queue_reqs`` reach 0 (or the drain timeout),
   then SIGTERM the process group, and SIGKILL after ``stop_timeout_s``.

``server_module`` can name another module that accepts the same flags: the emulator
(``backends.emulator``) does, which is how the lifecycle is tested on machines without a GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from backends.errors import LauncherError, LaunchTimeoutError
from backends.sglang.capacity import CapacityHints, fetch_capacity, write_capacity_file
from backends.sglang.endpoints import add_endpoint, remove_endpoint
from prefixindex.wire import KvEventsConfig

__all__ = ["LaunchConfig", "SGLangLauncher", "build_command"]


@dataclass(frozen=True, slots=True)
class LaunchConfig:
    model_path: str
    port: int
    pool_file: Path
    host: str = "127.0.0.1"
    advertise_host: str | None = None  # what the pool file lists (default: host)
    served_model_name: str | None = None
    max_running_requests: int | None = None
    max_queued_requests: int | None = None
    schedule_policy: str = "fcfs"
    chunked_prefill_size: int | None = None
    mem_fraction_static: float | None = None
    max_total_tokens: int | None = None
    page_size: int | None = None
    tp_size: int = 1
    kv_events_port: int | None = None  # publish KV-cache events (SGLang's --kv-events-config)
    kv_events_replay_port: int | None = None  # and serve replays (needs kv_events_port)
    # SGLang's priority scheduling (pools.NAME.priority_scheduling; emitted only when enabled)
    enable_priority_scheduling: bool = False
    priority_scheduling_preemption_threshold: int | None = None  # None: SGLang's default (10)
    schedule_low_priority_values_first: bool = False
    extra_args: tuple[str, ...] = ()
    python: str = field(default_factory=lambda: sys.executable)
    server_module: str = "sglang.launch_server"
    health_timeout_s: float = 900.0
    drain_timeout_s: float = 60.0
    stop_timeout_s: float = 30.0
    log_file: Path | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.advertise_host or self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def kv_events_config(self) -> KvEventsConfig | None:
        """The publisher config passed to the server (SGLang binds because of the ``*``)."""
        if self.kv_events_port is None:
            return None
        replay = self.kv_events_replay_port
        return KvEventsConfig(
            publisher="zmq",
            endpoint=f"tcp://*:{self.kv_events_port}",
            replay_endpoint=f"tcp://*:{replay}" if replay is not None else None,
        )

    def kv_events_addresses(self) -> dict[str, str | None] | None:
        """Where a subscriber connects: the advertised host with the publisher's ports."""
        cfg = self.kv_events_config()
        if cfg is None:
            return None
        host = self.advertise_host or self.host
        replay = cfg.replay_endpoint
        return {
            "endpoint": cfg.endpoint.replace("*", host),
            "replay_endpoint": replay.replace("*", host) if replay is not None else None,
        }

    @property
    def capacity_file(self) -> Path:
        return self.pool_file.with_name(self.pool_file.name + ".capacity.json")


def build_command(cfg: LaunchConfig) -> list[str]:
    """The command line (pure). Optional limits appear only when set."""
    argv = [
        cfg.python, "-m", cfg.server_module,
        "--model-path", cfg.model_path,
        "--host", cfg.host,
        "--port", str(cfg.port),
        "--enable-metrics",
        "--enable-cache-report",
        "--schedule-policy", cfg.schedule_policy,
    ]  # fmt: skip
    optional: list[tuple[str, object]] = [
        ("--served-model-name", cfg.served_model_name),
        ("--max-running-requests", cfg.max_running_requests),
        ("--max-queued-requests", cfg.max_queued_requests),
        ("--chunked-prefill-size", cfg.chunked_prefill_size),
        ("--mem-fraction-static", cfg.mem_fraction_static),
        ("--max-total-tokens", cfg.max_total_tokens),
        ("--page-size", cfg.page_size),
        ("--tp-size", cfg.tp_size if cfg.tp_size != 1 else None),
    ]
    for flag, value in optional:
        if value is not None:
            argv += [flag, str(value)]
    kv = cfg.kv_events_config()
    if kv is not None:
        argv += ["--kv-events-config", kv.to_json()]
    return argv + _priority_flags(cfg) + list(cfg.extra_args)


def _priority_flags(cfg: LaunchConfig) -> list[str]:
    if not cfg.enable_priority_scheduling:
        return []
    flags = ["--enable-priority-scheduling"]
    if cfg.priority_scheduling_preemption_threshold is not None:
        threshold = str(cfg.priority_scheduling_preemption_threshold)
        flags += ["--priority-scheduling-preemption-threshold", threshold]
    if cfg.schedule_low_priority_values_first:
        flags.append("--schedule-low-priority-values-first")
    return flags


async def _queue_depth(http: aiohttp.ClientSession, url: str) -> float:
    """Running + waiting requests from the server's ``/metrics``."""
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(("sglang:num_running_reqs", "sglang:num_queue_reqs")):
            total += float(line.rsplit(" ", 1)[1])
    return total


class SGLangLauncher:
    """One SGLang child process and its registration in a pool endpoint file."""

    def __init__(self, cfg: LaunchConfig, *, env: dict[str, str] | None = None) -> None:
        self.cfg = cfg
        self._env = env
        self._proc: asyncio.subprocess.Process | None = None
        self._log_fh: int | None = None
        self.registered = False
        self.capacity: CapacityHints | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def start(self) -> CapacityHints:
        """Launch, wait for health, read capacity, register. LauncherError on failure."""
        module_root = self.cfg.server_module.split(".")[0]
        if importlib.util.find_spec(module_root) is None:
            raise LauncherError(
                f"python module {module_root!r} is not installed; on a GPU host run "
                f"pip install -e '.[sglang]'"
            )
        log = self.cfg.log_file
        self._log_fh = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if log else None
        self._proc = await asyncio.create_subprocess_exec(
            *build_command(self.cfg),
            stdout=self._log_fh if self._log_fh is not None else asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **(self._env or {})},
            start_new_session=True,
        )
        try:
            await self._wait_healthy()
            hints = await fetch_capacity(self.cfg.url)
            self.capacity = dataclasses.replace(hints, kv_events=self.cfg.kv_events_addresses())
            write_capacity_file(self.cfg.capacity_file, self.cfg.endpoint, self.capacity)
            add_endpoint(self.cfg.pool_file, self.cfg.endpoint)
            self.registered = True
        except BaseException:
            await self.aclose()
            raise
        return self.capacity

    async def _wait_healthy(self) -> None:
        assert self._proc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.health_timeout_s
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while loop.time() < deadline:
                if self._proc.returncode is not None:
                    raise LauncherError(
                        f"{self.cfg.server_module} exited with {self._proc.returncode} "
                        f"before it was healthy (log: {self.cfg.log_file})"
                    )
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.get(self.cfg.url + "/health") as r:
                        if r.status == 200:
                            return
                await asyncio.sleep(0.2)
        raise LaunchTimeoutError(
            f"{self.cfg.url}/health not healthy after {self.cfg.health_timeout_s}s"
        )

    async def drain(self) -> None:
        """Deregister, then wait until no request runs or waits (bounded by the drain timeout)."""
        if self.registered:
            remove_endpoint(self.cfg.pool_file, self.cfg.endpoint)
            write_capacity_file(self.cfg.capacity_file, self.cfg.endpoint, None)
            self.registered = False
        if self._proc is None or self._proc.returncode is not None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.drain_timeout_s
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            while loop.time() < deadline:
                try:
                    if await _queue_depth(http, self.cfg.url) == 0:
                        return
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    return  # it no longer answers: nothing left to drain
                await asyncio.sleep(0.2)

    async def aclose(self) -> None:
        """Drain, then stop the process group (TERM, then KILL)."""
        try:
            await self.drain()
        finally:
            await self._stop()

    async def wait(self) -> int:
        """Until the child exits on its own; its exit status."""
        assert self._proc is not None
        return await self._proc.wait()

    async def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), self.cfg.stop_timeout_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        if self._log_fh is not None:
            os.close(self._log_fh)
            self._log_fh = None
