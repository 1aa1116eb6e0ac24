"""The arms of the overload benchmark, each on its own fresh pool of SGLang emulators.

- ``envoy``: plain Envoy, round robin, no governance (a static bootstrap written here: one
  listener, one route with no timeout, one round-robin cluster, breakers out of the way).
- ``sglang-router``: PyPI ``sglang-router`` (bench-only) with its own admission:
  ``--max-concurrent-requests`` = the pool's running slots, ``--queue-size``,
  ``--queue-timeout-secs``, ``--rate-limit-tokens-per-second`` = the pool's capacity in req/s.
- ``tokenweir`` and its variants: :mod:`overload_tokenweir` (``make_arm`` builds any arm).

Every process is a ``runtime.children.Child`` (own process group, dies with the benchmark) and
is stopped by ``aclose``. ``server_queues`` reads the backends' ``sglang:num_queue_reqs`` /
``num_running_reqs`` and, for tokenweir, the admission queues from the filter server's metrics.
"""

from __future__ import annotations

import asyncio
import json
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from runtime.children import Child, checkout, wait_child_port
from runtime.ports import free_port
from tokenweir.envoy_launcher import envoy_binary

__all__ = [
    "ARMS",
    "DROP",
    "EXTRA_ARMS",
    "MODEL",
    "POLICY",
    "Arm",
    "EmulatorPool",
    "InteractiveAlone",
    "PlainEnvoy",
    "PoolSpec",
    "SglangRouter",
    "plain_envoy_bootstrap",
]

ROOT = Path(__file__).resolve().parents[1]
POLICY = Path(__file__).resolve().parent / "overload_policy.yaml"
ARMS = ("envoy", "sglang-router", "tokenweir")
# not run by default: the tokenweir arm with batch taking every slot its share allows
# (``leave_for_higher: null``), for the before/after of the higher lanes' reserve
# (``tokenweir-no-priority``: the backends do not schedule by priority, for the before/after)
# (``tokenweir-ring``: the ranked pool balanced by Envoy's ring hash, not by lane)
# (``interactive-alone``: only the interactive lane's arrivals, straight through plain Envoy,
# least request: what the lane gets with the pool to itself, a bound on any admission policy)
# (``tokenweir-alt``: this policy, every knob included, on the ``--baseline-src`` checkout)
EXTRA_ARMS = (
    "interactive-alone",
    "tokenweir-no-reserve",
    "tokenweir-no-priority",
    "tokenweir-ring",
    "tokenweir-baseline",
    "tokenweir-alt",
    "tokenweir-variant",
)
MODEL = "llama-3.1-8b"
DROP = object()  # an override that removes the key from the bench policy


@dataclass(frozen=True, slots=True)
class PoolSpec:
    replicas: int
    running: int  # --max-running-requests of each replica (the pool's capacity per replica)
    profile: str
    time_scale: float
    capacity_rps: float  # requests/s the pool completes (overload_workload.pool_capacity_rps)
    queue_wait_s: float  # longest a queued request may wait (sglang-router, tokenweir batch)


@dataclass
class EmulatorPool:
    spec: PoolSpec
    run_dir: Path
    ports: list[int] = field(default_factory=list)
    children: list[Child] = field(default_factory=list)
    extra_args: tuple[str, ...] = ()  # more emulator flags (the arm's: priority scheduling)

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    async def start(self, label: str) -> None:
        s = self.spec
        for i in range(s.replicas):
            port = free_port()
            argv = [
                sys.executable, "-m", "backends.emulator", "--host", "127.0.0.1",
                "--port", str(port), "--model", MODEL, "--profile", s.profile,
                "--time-scale", str(s.time_scale), "--max-running-requests", str(s.running),
                "--seed", str(i), "--log-level", "WARNING", *self.extra_args,
            ]  # fmt: skip
            child = Child(f"emulator {label}#{i}", argv, self.run_dir / f"emu-{label}-{i}.log")
            child.start()
            self.children.append(child)
            self.ports.append(port)
        for port, child in zip(self.ports, self.children, strict=True):
            await wait_child_port("127.0.0.1", port, child)

    async def flush(self, http: aiohttp.ClientSession) -> bool:
        """Empty every replica's prefix cache (SGLang's ``/flush_cache``; 400 while busy)."""
        ok = True
        for url in self.urls:
            async with http.post(url + "/flush_cache") as r:
                ok = ok and r.status == 200
        return ok

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.children))


class Arm:
    """One gateway in front of its own emulator pool."""

    name = ""
    emulator_args: tuple[str, ...] = ()  # flags of this arm's emulators
    lanes: tuple[str, ...] | None = None  # the lanes whose arrivals this arm is sent (None: all)

    def __init__(self, pool: EmulatorPool, run_dir: Path, src: Path | None = None) -> None:
        self.pool = pool
        pool.extra_args = self.emulator_args
        self.run_dir = run_dir
        self.src = src  # the checkout whose code the gateway's processes import (None: this one)
        self.port = free_port()
        self.children: list[Child] = []
        self.queue_metrics_url: str | None = None  # a /metrics page with gateway queues
        self.access_log: Path | None = None  # the gateway's JSON access log, where it has one

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"

    async def start(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        for child in reversed(self.children):
            await child.aclose(2.0)
        await self.pool.aclose()

    def _spawn(self, name: str, argv: list[str]) -> Child:
        env, cwd = checkout(self.src)
        child = Child(name, argv, self.run_dir / f"{name}.log", env=env, cwd=cwd)
        child.start()
        self.children.append(child)
        return child


class PlainEnvoy(Arm):
    name = "envoy"
    lb_policy = "ROUND_ROBIN"

    async def start(self) -> None:
        path = self.run_dir / "envoy-plain.json"
        bootstrap = plain_envoy_bootstrap(self.port, self.pool.ports, self.lb_policy)
        path.write_text(json.dumps(bootstrap, indent=1))
        base_id = 1000 + zlib.crc32(str(path).encode()) % 60000
        child = self._spawn(
            "envoy-plain",
            [str(envoy_binary()), "-c", str(path), "--base-id", str(base_id),
             "--concurrency", "1", "--log-level", "warning"],
        )  # fmt: skip
        await wait_child_port("127.0.0.1", self.port, child)


class InteractiveAlone(PlainEnvoy):
    """The interactive lane's arrivals only, with no batch at all, through plain Envoy's least
    request: the TTFT the lane gets with the whole pool to itself. No admission policy in front of
    the same pool can give the lane a lower TTFT without shedding some of it, so this arm bounds
    what the issue's "p95 within 2x of unloaded" target can reach at each load."""

    name = "interactive-alone"
    lanes = ("interactive",)
    lb_policy = "LEAST_REQUEST"


class SglangRouter(Arm):
    name = "sglang-router"

    async def start(self) -> None:
        s = self.pool.spec
        slots = s.replicas * s.running
        argv = [
            sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
            "--port", str(self.port), "--worker-urls", *self.pool.urls,
            "--policy", "round_robin",
            "--max-concurrent-requests", str(slots), "--queue-size", str(2 * slots),
            "--queue-timeout-secs", str(max(1, round(s.queue_wait_s))),
            "--rate-limit-tokens-per-second", str(max(1, round(s.capacity_rps))),
            "--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1",
            "--log-level", "error",
        ]  # fmt: skip
        child = self._spawn("sglang-router", argv)
        await wait_child_port("127.0.0.1", self.port, child, timeout=60)


def plain_envoy_bootstrap(
    listen_port: int, backend_ports: list[int], lb_policy: str = "ROUND_ROBIN"
) -> dict[str, Any]:
    """One listener → one route (no timeout) → one cluster (round robin unless told); no
    governance."""
    high = {"max_connections": 100000, "max_pending_requests": 100000, "max_requests": 100000}
    endpoints = [
        {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": p}}}}
        for p in backend_ports
    ]
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "plain",
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [
                        {"match": {"prefix": "/"}, "route": {"cluster": "pool", "timeout": "0s"}}
                    ],
                }
            ]
        },
        "http_filters": [
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            }
        ],
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "plain",
                    "address": {
                        "socket_address": {"address": "127.0.0.1", "port_value": listen_port}
                    },
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": hcm,
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": "pool",
                    "type": "STATIC",
                    "lb_policy": lb_policy,
                    "connect_timeout": "1s",
                    "circuit_breakers": {"thresholds": [high]},
                    "load_assignment": {
                        "cluster_name": "pool",
                        "endpoints": [{"lb_endpoints": endpoints}],
                    },
                }
            ],
        },
    }
