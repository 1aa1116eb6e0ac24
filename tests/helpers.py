"""Shared test helpers: free loopback ports, child processes that always stop, a private Redis,
the JSON events of an SSE answer, a static Envoy cluster of one loopback endpoint."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from aiohttp import web

from runtime.ports import free_port as _free_port
from runtime.ports import free_port_block as _free_port_block
from runtime.ports import port_open

__all__ = [
    "ChildProcess",
    "free_port",
    "free_port_block",
    "redis_server",
    "serving",
    "sse_events",
    "static_cluster",
    "wait_for_port",
]

LOOPBACK = "127.0.0.1"


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[int]:
    """``app`` served on a free loopback port (yielded) while the block runs."""
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        port = free_port()
        await web.TCPSite(runner, LOOPBACK, port).start()
        yield port
    finally:
        await runner.cleanup()


async def sse_events(lines: AsyncIterator[bytes]) -> AsyncIterator[dict[str, Any]]:
    """The JSON events of an SSE answer's lines (``aiohttp``'s ``response.content``), without
    blank lines and the final ``[DONE]``."""
    async for line in lines:
        data = line.decode().strip().removeprefix("data: ")
        if data and data != "[DONE]":
            yield json.loads(data)


def static_cluster(name: str, port: int, http2: dict[str, Any] | None = None) -> dict[str, Any]:
    """An Envoy bootstrap cluster (JSON) of one endpoint on 127.0.0.1:``port``; with ``http2``
    (``http2_protocol_options``, ``{}`` for the defaults) it speaks HTTP/2 upstream."""
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {"endpoint": {"address": {"socket_address": {
                            "address": LOOPBACK, "port_value": port}}}}
                    ]
                }
            ],
        },
    }  # fmt: skip
    if http2 is not None:
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": http2},
            }
        }
    return cluster


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    return _free_port(LOOPBACK)


_RANDOM = random.SystemRandom()


def envoy_base_id() -> int:
    """An Envoy ``--base-id`` (its hot-restart socket names) for one test's Envoy: drawn at
    random from 4 million, so Envoys of several pytest workers do not collide (a counter
    seeded per worker did: workers allocate alike, and Envoy refused to start, errno 98)."""
    return 100_000 + _RANDOM.randrange(4_000_000)


def wait_for_port(port: int, timeout: float = 15.0, host: str = LOOPBACK) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_open(host, port):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s")


class ChildProcess:
    """A child process in its own process group, stopped (TERM, then KILL) on close."""

    def __init__(self, argv: list[str], *, log: Path, env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.log = log
        self._log_fh = log.open("wb")
        self.proc = subprocess.Popen(
            argv,
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        self._log_fh.flush()
        return self.log.read_text(errors="replace")

    def close(self, timeout: float = 5.0) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout)
        self._log_fh.close()


@contextlib.contextmanager
def redis_server(extra_args: list[str] | None = None) -> Iterator[int]:
    """Start a private redis-server on a free loopback port; yield the port; stop it."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError(
            "redis-server is not installed (scripts/ensure-system-deps.sh installs it)"
        )
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="tw-redis-") as tmp:
        argv = [
            binary,
            "--port",
            str(port),
            "--bind",
            LOOPBACK,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            tmp,
            *(extra_args or []),
        ]
        child = ChildProcess(argv, log=Path(tmp) / "redis.log")
        try:
            wait_for_port(port)
            yield port
        finally:
            child.close()


def free_port_block(count: int) -> int:
    """The first of ``count`` consecutive free loopback ports (for base_port settings)."""
    return _free_port_block(count, LOOPBACK)
