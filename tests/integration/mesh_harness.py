"""A real mesh for integration tests: our control plane in-process, real Envoy processes, and
small aiohttp backends that say who they are and can be told to fail or be slow."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from controlplane.app import ControlPlane, ControlPlaneSettings
from policy import Address
from tests.helpers import envoy_base_id, free_port
from tokenweir.envoy_launcher import EnvoyProcess, EnvoySettings

__all__ = ["Backend", "Mesh", "close_backends", "eventually", "mesh", "start_backends"]

_PROBES = frozenset({"/metrics", "/get_server_info", "/server_info"})


@dataclass
class Backend:
    """An HTTP backend that answers with its name; ``status``/``delay`` change its behaviour."""

    name: str
    port: int = 0
    status: int = 200
    health_status: int = 200
    delay: float = 0.0
    hits: int = 0
    metrics: str | None = None  # served on /metrics when set (the pool-state scraper reads it)
    seen_headers: list[dict[str, str]] = field(default_factory=list)
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        self.port = self.port or free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _handle(self, request: web.Request) -> web.Response:
        if request.path == "/health":
            return web.Response(status=self.health_status, text="ok")
        if request.path in _PROBES:  # the control plane's pool-state scraper, not traffic
            if request.path == "/metrics" and self.metrics is not None:
                return web.Response(text=self.metrics)
            return web.Response(status=404)
        self.hits += 1
        self.seen_headers.append({k.lower(): v for k, v in request.headers.items()})
        if self.delay:
            await asyncio.sleep(self.delay)
        body = await request.read()
        return web.Response(
            status=self.status,
            text=f"{self.name} {request.path} {len(body)}",
            headers={"x-backend": self.name},
        )

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def start_backends(n: int, prefix: str = "b") -> list[Backend]:
    """``n`` started backends named ``{prefix}0`` … ``{prefix}{n-1}``."""
    backends = [Backend(f"{prefix}{i}") for i in range(n)]
    for b in backends:
        await b.start()
    return backends


async def eventually(probe, want, timeout: float = 8.0):  # type: ignore[no-untyped-def]
    """Call ``probe()`` until it returns ``want`` (health checks run on their own clock)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    got = await probe()
    while got != want and loop.time() < end:
        await asyncio.sleep(0.1)
        got = await probe()
    return got


async def close_backends(backends: list[Backend]) -> None:
    for b in backends:
        await b.aclose()


@dataclass
class Mesh:
    policy_path: Path
    plane: ControlPlane
    envoys: dict[str, EnvoyProcess]
    session: aiohttp.ClientSession

    def write_policy(self, text: str) -> None:
        tmp = self.policy_path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.policy_path)

    async def get(
        self,
        port: int,
        path: str = "/",
        headers: dict[str, str] | None = None,
        timeout: float = 10.0,
    ) -> tuple[int, dict[str, str], str]:
        async with self.session.get(
            f"http://127.0.0.1:{port}{path}",
            headers=headers or {},
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as r:
            return r.status, dict(r.headers), await r.text()

    async def wait_applied(self, version_predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while loop.time() < end:
            if version_predicate():
                return
            await asyncio.sleep(0.05)
        raise TimeoutError("config was not applied in time")

    async def clusters_text(self, node: str) -> str:
        _, body = await self.envoys[node].admin_get("/clusters")
        return body


@contextlib.asynccontextmanager
async def mesh(
    tmp_path: Path,
    policy_text: str,
    nodes: dict[str, int],
    *,
    delta: bool = True,
    metrics_port: int | None = None,
) -> AsyncIterator[Mesh]:
    """Start the control plane on ``policy_text`` and one Envoy per node group in ``nodes``
    (group → a listener port to wait for). ``metrics_port``: the control plane's metrics
    address (its pool state), where the policy's ``control_plane.metrics`` names it for a
    filter server to read; a free port otherwise."""
    policy_path = tmp_path / "mesh.yaml"
    policy_path.write_text(policy_text)
    xds, metrics = free_port(), metrics_port or free_port()
    plane = ControlPlane(
        ControlPlaneSettings(
            policy_path, Address("127.0.0.1", xds), Address("127.0.0.1", metrics), debounce=0.05
        )
    )
    result = await plane.start()
    assert result.ok, result.problems
    envoys: dict[str, EnvoyProcess] = {}
    session = aiohttp.ClientSession()
    try:
        for node, port in nodes.items():
            env = EnvoyProcess(
                EnvoySettings(
                    node_id=f"{node}-test",
                    node_cluster=node,
                    xds_port=plane.xds_port,
                    base_id=envoy_base_id(),
                    delta=delta,
                ),
                tmp_path / f"envoy-{node}",
            )
            envoys[node] = env
            await env.start()
            await _wait_port(port)
        yield Mesh(policy_path, plane, envoys, session)
    finally:
        await session.close()
        for env in envoys.values():
            await env.aclose()
        await plane.aclose()


async def _wait_port(port: int, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port}")
