"""``tokenweir up``: the whole local mesh from one policy file.

Starts, in order: a private redis-server (when the policy has a rate-limit section and names no
Redis), the SGLang emulator replicas of pools marked ``emulated``, the rate-limit service, the
filter server, the control plane (in this process), and one Envoy per gateway and sidecar fed
over ADS, and, when Debian's ``prometheus`` is installed, a Prometheus scraping all of them with
the repository's recording rules and alerts (``tokenweir.prometheus``). Prints every URL.

Every child that dies is started again, on its port, with backoff (``tokenweir.restarter``;
docs/operations.md "When a part dies"); ``up`` ends only when asked, or when a part's first
start fails.

Ctrl-C (or SIGTERM) drains, in this order (``docs/operations.md``): the control plane reports
NOT_SERVING; every Envoy fails its health check, drains its listeners and gets up to
``control_plane.drain_timeout`` (``--drain-timeout``) for the requests in flight; then the
filter server, the rate-limit service (each drains on SIGTERM) and the control plane stop;
the emulators and Redis last. A second Ctrl-C cuts the waiting short.

What operators change live (quota edits, API keys, revocations) lives in the private Redis,
which keeps an append-only file (``appendfsync everysec``) in a state directory reused by the
next run: ``.tokenweir/state`` next to the policy, ``--state-dir`` elsewhere, ``--fresh`` to
start empty (``runtime.statedir``). While the mesh runs, ``<state>/mesh.json`` names its Redis
for ``tokenweir quota`` and ``tokenweir keys``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry

from controlplane.app import ControlPlane, ControlPlaneSettings
from policy import Address, Policy
from policy.ports import port_plan
from policy.servers import Replicas, replica_addresses
from runtime.admin_auth import TOKEN_FILE_ENV, admin_token
from runtime.children import Child, wait_child_port
from runtime.metrics_http import MetricsServer
from runtime.ports import free_port
from runtime.statedir import (
    MeshInfo,
    write_mesh_info,
)
from tokenweir.check import reloader_prepare, service_issues
from tokenweir.envoy_launcher import EnvoyProcess, EnvoySettings
from tokenweir.prometheus import (
    Prometheus,
    Target,
    prometheus_binary,
    render_config,
    scrape_targets,
)
from tokenweir.restarter import Part, Supervisor
from tokenweir.up_autoscale import EmulatorFleet, FleetMetrics
from tokenweir.up_batch import start_batch
from tokenweir.up_lora import lora_args
from tokenweir.up_parts import (
    base_id,
    connection_cap,
    flavor_args,
    kv_event_args,
    unless,
    wait_listening,
)
from tokenweir.up_secure import REDIS_URL_ENV, REDIS_USER, Secure, redis_config, secret_file

__all__ = ["Mesh"]


log = logging.getLogger("tokenweir.up")


def _say(line: str) -> None:
    print(line, flush=True)


class Mesh:
    def __init__(
        self,
        config: Path,
        policy: Policy,
        run_dir: Path,
        *,
        redis_url: str | None,
        delta: bool,
        state_dir: Path | None = None,
        replicas: Replicas | None = None,
        prometheus: tuple[int, float] | None = None,
        autoscale: bool = False,
        secure: Secure | None = None,
    ) -> None:
        self.config = config.resolve()
        self.secure = secure or Secure()  # generated secrets (tokenweir.up_secure)
        # what every child gets in its environment (secrets never go on a command line)
        self.child_env: dict[str, str] = {}
        if self.secure.admin_token_file is not None:
            self.child_env[TOKEN_FILE_ENV] = str(self.secure.admin_token_file)
        self.override = replicas  # --replicas (the control planes apply it on every reload)
        self.replicas = replicas or policy.replicas
        self.policy = dataclasses.replace(policy, replicas=self.replicas)
        self.run_dir = run_dir
        self.state_dir = state_dir  # None: Redis data in the run folder, nothing kept
        self.redis_url = redis_url or (policy.ratelimit.redis_url if policy.ratelimit else None)
        self.delta = delta
        self.children: list[Child] = []  # emulators and Redis: stopped last
        self.services: list[Child] = []  # rate-limit service, filter server: drain on SIGTERM
        self.envoys: dict[str, EnvoyProcess] = {}  # "edge" or, with replicas, "edge#0", ...
        self.plane: ControlPlane | None = None  # in this process (one control plane)
        self.planes: list[Child] = []  # control planes as child processes (replicas > 1)
        self.xds: list[Address] = []
        self.supervisor = Supervisor(say=_say)  # every child that dies is started again
        self.supervisor_metrics: MetricsServer | None = None  # up's own, when no plane runs here
        self.supervisor_port = 0
        self.lines: list[str] = []
        self.prometheus_settings = prometheus  # (port or 0 for a free one, scrape interval s)
        self.prometheus: Prometheus | None = None
        self.admin_ports: dict[str, int] = {}
        # the ports the policy places (up_cli has checked them for clashes): the ports picked
        # here for Redis, Envoy admins and Prometheus stay off them
        self.planned = frozenset(c.port for c in port_plan(self.policy))
        self.autoscale = autoscale  # --autoscale: fleets follow the online planner (issue 42)
        self.fleets: dict[str, EmulatorFleet] = {}  # autoscaled emulated pools

    async def start(self) -> None:
        p = self.policy
        if p.ratelimit is not None and self.redis_url is None:
            await self._start_redis()
        if self.redis_url is not None:
            self.child_env[REDIS_URL_ENV] = self.redis_url
        if self.state_dir is not None:
            info = MeshInfo(pid=os.getpid(), redis_url=self.redis_url, policy=str(self.config))
            write_mesh_info(self.state_dir, info)
        await self._start_emulators()
        n = self.replicas
        if p.ratelimit is not None:
            await self._start_module(
                "ratelimit", "ratelimit_service", p.ratelimit.address, p.ratelimit.metrics_port,
                count=n.ratelimit, processes=p.ratelimit.replicas,
            )  # fmt: skip
        if p.filters is not None:
            await self._start_module(
                "filters", "filters", p.filters.address, p.filters.metrics_port,
                count=n.filters, processes=p.filters.processes,
            )  # fmt: skip
        # before the control plane: a fork from a process running gRPC threads can crash the child
        await start_batch(self)  # the batch API and its runners (docs/batch.md)
        if self.prometheus_settings is not None:
            await self._start_prometheus(*self.prometheus_settings)
        if n.controlplane == 1:
            await self._start_plane()
        else:
            await self._start_planes(n.controlplane)
        await self._start_envoys()
        self._run_fleets()

    async def _start_prometheus(self, port: int, interval: float) -> None:
        binary = prometheus_binary()
        if binary is None:
            self.lines.append("prometheus      not installed (apt install prometheus): not started")
            return
        admins = {n: f"127.0.0.1:{port}" for n, port in self._admin_ports().items()}
        targets = scrape_targets(self.policy, admins)
        if self.replicas.controlplane > 1:  # the supervisor's metrics are up's own then
            up = f"127.0.0.1:{self._supervisor_port()}"
            targets.append(Target("controlplane", up, (("replica", "up"),)))
        config = render_config(
            targets, interval_s=interval, token_file=self.secure.admin_token_file
        )
        port = port or free_port(avoid=self.planned)
        prom = Prometheus(binary, self.run_dir, "127.0.0.1", port, config)
        await prom.start()
        self.prometheus = prom
        self.children.append(prom.child)
        self._watch(prom.child, Address(prom.host, prom.port))
        self.lines.append(f"prometheus      {prom.url}  (rules and alerts: deploy/prometheus/)")

    def _envoy_nodes(self) -> list[tuple[str, Address, str, int]]:
        nodes = [
            (n, g.listen, "gateway", self.replicas.gateway) for n, g in self.policy.gateways.items()
        ]
        for n, sc in self.policy.sidecars.items():
            side = sc.outbound or sc.inbound
            assert side is not None  # the loader requires one of them
            nodes.append((n, side.listen, "sidecar", 1))
        return nodes

    def _admin_ports(self) -> dict[str, int]:
        """Each Envoy's admin port, chosen before anything starts (Prometheus scrapes them)."""
        if not self.admin_ports:
            for node, _, _, count in self._envoy_nodes():
                for i in range(count):
                    key = node if count == 1 else f"{node}#{i}"
                    self.admin_ports[key] = free_port(avoid=self.planned)
        return self.admin_ports

    async def _start_plane(self) -> None:
        cp = self.policy.control_plane
        self.plane = ControlPlane(
            ControlPlaneSettings(
                self.config,
                cp.xds,
                cp.metrics,
                cp.debounce,
                self.override,
                self.redis_url,
                admin_token=admin_token({**os.environ, **self.child_env}),
            ),
            check=service_issues,
            build_worker=reloader_prepare,
        )
        self.plane.registry.register(self.supervisor.collector())  # on the plane's /metrics
        result = await self.plane.start()
        if not result.ok:
            raise RuntimeError("policy rejected:\n" + "\n".join(result.problems))
        self.xds = [Address(cp.xds.host, self.plane.xds_port)]
        self.lines.append(
            f"control plane   xDS grpc://{cp.xds}  metrics http://{cp.metrics}/metrics"
        )
        self.lines.append(f"dashboard       http://{cp.metrics}/dashboard/")

    async def _start_planes(self, count: int) -> None:
        """``count`` control planes (``tokenweir serve``) on consecutive ports."""
        problems = service_issues(self.policy, self.config)
        if problems:
            raise RuntimeError("policy rejected:\n" + "\n".join(str(i) for i in problems))
        cp = self.policy.control_plane
        xds = replica_addresses(cp.xds, count)
        metrics = replica_addresses(cp.metrics, count)
        for i, (x, m) in enumerate(zip(xds, metrics, strict=True)):
            argv = [
                sys.executable, "-m", "tokenweir.cli", "serve", "-c", str(self.config),
                "--xds", str(x), "--metrics", str(m), "--replicas", str(self.replicas),
            ]  # fmt: skip
            child = Child(f"controlplane#{i}", argv, self.run_dir / f"controlplane-{i}.log")
            await self._spawn(child, x, service=False, into=self.planes)
            self.lines.append(
                f"control plane#{i} xDS grpc://{x}  metrics http://{m}/metrics  pid {child.pid}"
            )
        self.xds = list(xds)
        registry = CollectorRegistry()  # no control plane in this process: up serves its own
        registry.register(self.supervisor.collector())
        port = self._supervisor_port()
        self.supervisor_metrics = MetricsServer(registry, "127.0.0.1", port)
        await self.supervisor_metrics.start()
        self.lines.append(f"supervisor      metrics http://127.0.0.1:{port}/metrics")

    def _supervisor_port(self) -> int:
        """Where ``up`` serves its supervisor's metrics when no control plane runs in it, chosen
        before anything starts (Prometheus scrapes it)."""
        if self.supervisor_port == 0:
            self.supervisor_port = free_port(avoid=self.planned)
        return self.supervisor_port

    def _redis_args(self) -> list[str]:
        return []  # the URL (with its password) travels in TOKENWEIR_REDIS_URL: self.child_env

    async def _start_redis(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "the policy uses rate limits but redis-server is not installed and no --redis-url was given"
            )
        port = free_port(avoid=self.planned)
        data = (self.state_dir or self.run_dir) / "redis"
        data.mkdir(parents=True, exist_ok=True)
        secrets_dir = self.state_dir or self.run_dir
        password = secret_file(secrets_dir / "redis-password")
        argv = [
            binary,
            str(redis_config(secrets_dir, password)),  # the ACL, off the command line
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            str(data),
        ]
        if self.state_dir is not None:  # live edits survive a restart (at most 1 s lost on a crash)
            argv += ["--appendonly", "yes", "--appendfsync", "everysec"]
        await self._spawn(
            Child("redis", argv, self.run_dir / "redis.log"), Address("127.0.0.1", port)
        )
        self.redis_url = f"redis://{REDIS_USER}:{password}@127.0.0.1:{port}/0"
        kept = f"  (data kept in {data})" if self.state_dir is not None else ""
        self.lines.append(
            f"redis           redis://{REDIS_USER}@127.0.0.1:{port}/0  password in "
            f"{secrets_dir / 'redis-password'}{kept}"
        )

    async def _start_emulators(self) -> None:
        for name, pool in self.policy.pools.items():
            em = pool.emulated
            if em is None or em.base_port is None:
                continue
            if pool.autoscale is not None:
                await self._start_fleet(name)
                continue
            for i in range(em.replicas):
                addr = Address("127.0.0.1", em.base_port + i)
                argv = self._emulator_argv(name, i, addr)
                await self._spawn(
                    Child(f"emulator {name}#{i}", argv, self.run_dir / f"emulator-{name}-{i}.log"),
                    addr,
                )
                self.lines.append(
                    f"emulator        {name}#{i} http://{addr} (metrics http://{addr}/metrics)"
                )

    def _emulator_argv(self, name: str, i: int, addr: Address) -> list[str]:
        pool = self.policy.pools[name]
        em = pool.emulated
        assert em is not None
        argv = [
            sys.executable, "-m", "backends.emulator",
            "--host", addr.host, "--port", str(addr.port),
            "--model", pool.models[0], "--profile", em.profile,
            "--time-scale", str(em.time_scale), "--seed", str(i),
        ]  # fmt: skip
        if em.cache_tokens is not None:
            argv += ["--cache-tokens", str(em.cache_tokens)]
        argv += kv_event_args(pool.routing, addr)
        argv += flavor_args(pool)  # backend: vllm → --flavor vllm
        argv += lora_args(pool)  # pools.NAME.lora → --enable-lora, --lora-paths, slots
        argv += pool.priority_scheduling.server_flags()  # as a real SGLang gets them
        if self.policy.tracing is not None:  # as SGLang: a span per request
            argv += [
                "--enable-trace",
                "--otlp-traces-endpoint",
                str(self.policy.tracing.collector),
            ]
        return argv

    async def _start_fleet(self, name: str) -> None:
        """An autoscaled emulated pool: its replicas and endpoints file belong to a fleet."""
        pool = self.policy.pools[name]
        assert pool.emulated is not None and pool.endpoints_file is not None
        path = (self.config.parent / pool.endpoints_file).resolve()
        slots = pool.capacity.max_running_requests  # the batch the pool declares, as SGLang runs
        cap = ["--max-running-requests", str(slots)] if slots is not None else []
        fleet = EmulatorFleet(
            name, pool, path, self.run_dir,
            argv=lambda i, addr: self._emulator_argv(name, i, addr) + cap, say=_say,
        )  # fmt: skip
        self.fleets[name] = fleet
        await fleet.start_initial(pool.emulated.replicas)
        how = "follows the planner" if self.autoscale else "fixed: no --autoscale"
        self.lines.append(
            f"emulator        {name}: {len(fleet.serving())} replica(s) from :{fleet.base_port}"
            f" ({how}; serving replicas listed in {path})"
        )

    def _run_fleets(self) -> None:
        plane = self.plane
        metrics = FleetMetrics(plane.registry) if plane is not None and self.fleets else None
        for name, fleet in self.fleets.items():
            if plane is None:  # control planes in child processes: the count stays
                fleet.start()
                continue
            em = self.policy.pools[name].emulated
            assert em is not None

            def published(pool: str = name) -> frozenset[str]:
                assert plane is not None
                t = plane.scraper.targets.get(pool)
                return frozenset(t.endpoints) if t is not None else frozenset()

            def desired(pool: str = name, start: int = em.replicas) -> int:
                assert plane is not None
                want = plane.autoscaler.desired(pool) if self.autoscale else None
                return start if want is None else want

            fleet.start(
                desired=desired, published=published, autoscaler=plane.autoscaler, metrics=metrics
            )

    async def _start_module(
        self,
        label: str,
        module: str,
        addr: Address,
        metrics_port: int | None,
        *,
        count: int,
        processes: int,
    ) -> None:
        """``count`` servers; replica i on ``addr.port + i`` (docs/deploy.md)."""
        for i, listen in enumerate(replica_addresses(addr, count)):
            name = label if count == 1 else f"{label}#{i}"
            argv = [sys.executable, "-m", module, "--policy", str(self.config)]
            argv += self._redis_args()
            metrics = metrics_port + i * processes if metrics_port else None
            # how many run side by side, whatever the policy file says (--replicas overrides
            # it): the rate-limit service sizes its local fallback bucket by it, the filter
            # server its share of each pool's admission capacity
            argv += ["--instances", str(count)]
            if count > 1:
                argv += ["--listen", str(listen)]
                argv += ["--metrics-port", str(metrics)] if metrics else []
            child = Child(name, argv, self.run_dir / f"{name.replace('#', '-')}.log")
            await self._spawn(child, listen, service=True)
            url = f"  metrics http://127.0.0.1:{metrics}/metrics" if metrics else ""
            self.lines.append(f"{name:<15} grpc://{listen}{url}  pid {child.pid}")

    async def _spawn(
        self, child: Child, addr: Address, *, service: bool = False, into: list[Child] | None = None
    ) -> None:
        child.env.update(self.child_env)
        child.start()
        (into if into is not None else self.services if service else self.children).append(child)
        await wait_child_port(addr.host, addr.port, child)
        self._watch(child, addr)

    def _watch(self, child: Child, addr: Address) -> None:
        """Start ``child`` again (same argv: same port) whenever it dies."""

        async def again() -> str:
            await child.aclose(0.0)  # what a failed try left running
            child.start(append=True)
            await wait_child_port(addr.host, addr.port, child)
            return f"pid {child.pid}"

        self.supervisor.watch(
            Part(child.name, child.alive, lambda: child.returncode, child.log_tail, again)
        )

    def _watch_envoy(self, node: str, key: str, listen: Address, index: int) -> None:
        """Start Envoy ``key`` again whenever it dies: a fresh ``--base-id``, the same ports."""

        async def again() -> str:
            dead = self.envoys[key]
            await dead.aclose(0.0)  # what a failed try left running
            with contextlib.suppress(OSError):  # a fresh Envoy empties its log: keep the dead one's
                dead.log_path.replace(dead.log_path.with_name(dead.log_path.name + ".1"))
            fresh = await self._start_envoy(node, key, listen, index)
            return f"pid {fresh.pid}, admin {fresh.admin_url}"

        self.supervisor.watch(
            Part(
                f"envoy {key}",
                lambda: self.envoys[key].alive(),
                lambda: self.envoys[key].returncode,
                lambda: self.envoys[key].log_tail(),
                again,
            )
        )

    async def _start_envoys(self) -> None:
        for node, listen, role, count in self._envoy_nodes():
            for i in range(count):
                key = node if count == 1 else f"{node}#{i}"
                envoy = await self._start_envoy(node, key, listen, i)
                self._watch_envoy(node, key, listen, i)
                gw = self.policy.gateways.get(node)
                scheme = "https" if gw is not None and gw.tls is not None else "http"
                self.lines.append(
                    f"envoy {role:<9} {key}: {scheme}://{listen}  admin {envoy.admin_url}  pid {envoy.pid}"
                )
        for name, sc in self.policy.sidecars.items():
            if sc.inbound is not None:
                self.lines.append(
                    f"  {name} inbound  http://{sc.inbound.listen} → app {sc.inbound.local}"
                )

    async def _start_envoy(self, node: str, key: str, listen: Address, index: int) -> EnvoyProcess:
        """One Envoy of node group ``node``; a restarted replica gets a fresh ``--base-id``."""
        generation = self.supervisor.restarts(f"envoy {key}")
        first, *more = self.xds
        settings = EnvoySettings(
            node_id=f"{node}-{index}", node_cluster=node, xds_host=first.host,
            xds_port=first.port, xds_more=tuple((a.host, a.port) for a in more),
            base_id=base_id(self.run_dir, f"{key}/{generation}"), delta=self.delta,
            max_downstream_connections=connection_cap(self.policy, node),
            admin_port=self._admin_ports().get(key, 0),
        )  # fmt: skip
        envoy = EnvoyProcess(settings, self.run_dir)
        await envoy.start()
        self.envoys[key] = envoy
        await wait_listening(listen, envoy)
        return envoy

    def summary(self) -> str:
        gw = next(iter(self.policy.gateways.values()), None)
        head = f"tokenweir up: mesh running (logs in {self.run_dir}); Ctrl-C stops everything"
        scheme = "https" if gw is not None and gw.tls is not None else "http"
        url = f"\n  gateway: {scheme}://{gw.listen}/v1/chat/completions" if gw is not None else ""
        if self.secure.ca_file is not None:
            url += f"\n  CA file: {self.secure.ca_file}  (curl --cacert it)"
        if self.secure.admin_token_file is not None:
            url += f"\n  admin token: {self.secure.admin_token_file}  (Authorization: Bearer)"
        if gw is not None and self.replicas.gateway > 1:
            url += f"  ({self.replicas.gateway} Envoys share this port: SO_REUSEPORT)"
        return head + url + "\n  " + "\n  ".join(self.lines) + "\ntokenweir up: ready"

    async def watch_children(self) -> None:
        """Keep every child running (``tokenweir.restarter``) until cancelled: returns only
        if supervising itself fails."""
        self.supervisor.start()
        await asyncio.Event().wait()

    async def aclose(
        self, drain_timeout: float = 0.0, *, force: asyncio.Event | None = None
    ) -> None:
        """Stop everything, Envoys first (after draining them for up to ``drain_timeout`` s),
        then the services (each drains on SIGTERM), the control plane, emulators and Redis.
        Setting ``force`` (a second Ctrl-C) cuts every wait short."""
        await self.supervisor.aclose()  # from here on, an exit is a stop, not a death
        if self.plane is not None:
            await self.plane.drain()  # NOT_SERVING before anything else
        for plane in self.planes:
            plane.signal(signal.SIGTERM)  # each reports NOT_SERVING and stops reloading
        await unless(force, self._drain_envoys(drain_timeout))
        await asyncio.gather(*(e.aclose() for e in self.envoys.values()))
        self.envoys.clear()
        grace = 0.0 if force is not None and force.is_set() else drain_timeout + 5.0
        await unless(force, asyncio.gather(*(c.aclose(grace) for c in self.services)))
        await asyncio.gather(*(c.aclose(0.0) for c in self.services))  # whatever is left
        self.services.clear()
        if self.plane is not None:
            await self.plane.aclose()
            self.plane = None
        await asyncio.gather(*(c.aclose(5.0) for c in self.planes))
        self.planes.clear()
        await asyncio.gather(*(f.aclose() for f in self.fleets.values()))
        for child in reversed(self.children):
            await child.aclose()
        self.children.clear()
        if self.supervisor_metrics is not None:
            await self.supervisor_metrics.aclose()

    async def _drain_envoys(self, timeout: float) -> None:
        left = await asyncio.gather(*(e.drain(timeout) for e in self.envoys.values()))
        for node, active in zip(self.envoys, left, strict=True):
            if active:
                log.warning("envoy %s: drain timeout, %s request(s) still active", node, active)
