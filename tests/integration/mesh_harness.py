"""A real mesh for integration tests: our control plane in-process, real Envoy processes, and
small aiohttp backends that say who they are and can be told to fail or be slow; the policy
of a small mesh, and the rate-limit service and the filter server as processes beside it."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from controlplane.app import ControlPlane, ControlPlaneSettings
from policy import Address
from tests.helpers import ChildProcess, envoy_base_id, free_port, wait_for_port
from tokenweir.envoy_launcher import EnvoyProcess, EnvoySettings

__all__ = [
    "Backend",
    "Mesh",
    "close_backends",
    "eventually",
    "mesh",
    "mesh_policy",
    "metered_route",
    "service_processes",
    "start_backends",
    "token_tier",
]

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


def mesh_policy(
    *,
    gw: int,
    fp: int,
    pools: Mapping[str, tuple[str, int | Sequence[int]] | str],
    routes: Sequence[str],
    rest: str,
    rp: int | None = None,
    redis_url: str = "",
    filters: str = "message_timeout: 2s",
    ratelimit: str = ", reservation_ttl: 60s",
    ratelimit_timeout: str = "500ms",
    pool_extra: str = "",
) -> str:
    """The policy of a small mesh: gateway ``edge`` on ``gw`` with ``routes`` (a YAML flow
    mapping each), the filter server on ``fp`` (``filters``: its other settings), a pool per
    ``pools`` entry (name → its model and its backends' ports, no health checks, no retries,
    ``pool_extra`` appended; or the pool's own flow mapping as text), the rate-limit service on
    ``rp`` (``ratelimit_timeout``, its Redis ``redis_url``, ``ratelimit`` appended) where given;
    ``rest``: the sections after those (tiers, tenants, ...). The control plane's own addresses
    are placeholders: :func:`mesh` gives it free ports."""
    service = (
        f"ratelimit: {{address: 127.0.0.1:{rp}, timeout: {ratelimit_timeout}, "
        f'redis_url: "{redis_url}"{ratelimit}}}\n'
        if rp is not None
        else ""
    )
    pool_lines = "".join(
        f"  {name}: {pool if isinstance(pool, str) else _pool(*pool, pool_extra)}\n"
        for name, pool in pools.items()
    )
    route_lines = "".join(f"      - {r}\n" for r in routes)
    return (
        "version: 1\ncontrol_plane: {xds: 127.0.0.1:1, metrics: 127.0.0.1:2}\n"
        f"{service}filters: {{address: 127.0.0.1:{fp}, {filters}}}\n"
        f"pools:\n{pool_lines}"
        f"gateways:\n  edge:\n    listen: 127.0.0.1:{gw}\n    routes:\n{route_lines}"
        f"{rest.strip()}\n"
    )


def metered_route(
    name: str = "llm",
    pool: str = "chat",
    match: str = "{prefix: /v1/}",
    *,
    plugins: str = "identity, tokens, prefix, lane, usage",
    filters: str = "",
    extra: str = "",
) -> str:
    """A rate-limited route to ``pool`` with ``plugins`` (``filters``: more filter-chain
    settings, e.g. ``", failure_mode: open"``; ``extra``: more route keys, e.g.
    ``", lane: batch"``)."""
    return (
        f"{{name: {name}, match: {match}, pool: {pool}{extra}, rate_limit: {{enabled: true}}, "
        f"filters: {{plugins: [{plugins}]{filters}}}}}"
    )


def _pool(model: str, ports: int | Sequence[int], extra: str) -> str:
    eps = ", ".join(f"127.0.0.1:{p}" for p in ([ports] if isinstance(ports, int) else ports))
    return (
        f"{{models: [{model}], endpoints: [{eps}], "
        f"health_check: {{enabled: false}}, retries: {{enabled: false}}{extra}}}"
    )


def token_tier(
    budget: int,
    tenants: Mapping[str, str],
    *,
    tier: str = "small",
    max_tokens: int = 100,
    refill: float = 0.01,
) -> str:
    """Tier ``tier`` (``max_tokens`` a request at most, a token budget of ``budget`` that
    refills ``refill`` a second: hardly, unless told) and ``tenants`` (name → API key) on it."""
    names = "".join(f"  {t}: {{tier: {tier}, api_keys: [{k}]}}\n" for t, k in tenants.items())
    quotas = f"{{tokens: {{burst: {budget}, refill_per_second: {refill}}}}}"
    return (
        f"tiers:\n  {tier}:\n    max_tokens: {max_tokens}\n    quotas: {quotas}\ntenants:\n{names}"
    )


@contextlib.asynccontextmanager
async def service_processes(
    tmp_path: Path,
    policy_path: Path,
    redis_url: str | None,
    ports: Mapping[str, int],
    *,
    timeout: float = 20.0,
    extra: Mapping[str, Sequence[str]] | None = None,
) -> AsyncIterator[dict[str, ChildProcess]]:
    """The services ``ports`` names (module → its port: ``ratelimit_service``, ``filters``) as
    processes on ``policy_path`` (``--redis-url`` where given; ``extra``: more arguments by
    module), started in that order, each waited for ``timeout`` s at most, its log
    ``<module>.log`` in ``tmp_path``; stopped on exit."""
    children: dict[str, ChildProcess] = {}
    try:
        for mod, port in ports.items():
            argv = [sys.executable, "-m", mod, "--policy", str(policy_path)]
            argv += ["--redis-url", redis_url] if redis_url is not None else []
            argv += (extra or {}).get(mod, [])
            children[mod] = ChildProcess(argv, log=tmp_path / f"{mod}.log")
            await asyncio.to_thread(wait_for_port, port, timeout)
        yield children
    finally:
        for child in children.values():
            child.close()


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
