"""The running filter server: policy → services → gRPC server, /metrics, live policy reload.

Everything here belongs to :class:`FilterApp`. ``drain(timeout)`` reports NOT_SERVING on
``grpc.health.v1.Health`` and ``/healthz``, refuses new ext_proc streams and lets those in
flight finish; ``aclose()`` then stops the watcher, the metrics endpoint, the gRPC server and
the Redis connection, in that order.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from filters.aborts import Aborter
from filters.budget import Budget, CachedBudget, NoBudget, quota_reader_budget
from filters.estimate import Estimator, load_estimator
from filters.h2server import LIMITS, H2FilterServer
from filters.keys import KeyInfo, KeyStore, policy_keys
from filters.metrics import FilterMetrics
from filters.output_lengths import OutputLengths
from filters.output_lengths_shared import SharedLengths
from filters.plugins.admission.fairshare import FairShare
from filters.plugins.admission.gate import Gates
from filters.plugins.admission.shared import SharedReturns
from filters.plugins.admission.signal import (
    admission_source,
    alive_source,
    capacity_source,
    down_source,
    ladder_source,
    pool_state_reader,
    ranking_source,
    ready_source,
)
from filters.plugins.admission.spread import LaneBalance
from filters.plugins.collapse.fanout import FanoutServer
from filters.plugins.collapse.hub import Hub
from filters.plugins.degrade.state import Ladders, uses_ladder
from filters.plugins.lora.hub import LoraHub
from filters.plugins.pd.hub import PdHub
from filters.plugins.picker.registry import Pickers
from filters.plugins.shadow.metrics import ShadowMetrics
from filters.plugins.shadow.recorder import ShadowRecorder
from filters.redis_pool import redis_client
from filters.registry import RouteEntry, build_routes, iter_routes
from filters.server import FilterServer, FilterServicer
from filters.services import Services, default_services
from filters.usage_log import UsageLog
from policy import Policy, load_policy
from policy.phases import uses_collapse, uses_shadow_pairs
from poolstate.valley import runner_pool
from poolstate.valley_reader import ValleyReader
from quota.topup import TopUps
from runtime.admin_auth import admin_tls, admin_token
from runtime.h2 import transport_for
from runtime.health import HealthState
from runtime.metrics_http import MetricsServer
from runtime.redis_connect import verify_credentials
from runtime.tasks import stop_task
from runtime.tls_server import RenewingTls, ServerTlsFiles, check_plaintext
from runtime.tracing import TracingSwitch
from runtime.watcher import InWorker, Loaded, PolicyWatcher, ReloadMetrics, ReloadOutcome

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["FilterApp", "Settings", "prepare"]

_log = logging.getLogger(__name__)
BOOT_WAIT_S = 1.0  # longest wait for the first pool state before serving


@dataclass(frozen=True)
class Settings:
    policy_path: Path
    redis_url: str | None = None
    listen: str | None = None  # host:port; default: the policy's filters.address
    metrics_port: int | None = None
    tokenizer_file: str | None = None
    key_cache_seconds: float = 1.0
    budget_cache_seconds: float = 0.25
    worker_index: int = 0
    reload_interval: float = 1.0
    transport: str = "h2"  # "h2": filters.h2server (no grpc.aio); "grpc": grpc.aio
    build_worker: bool = True  # reloads build in a child process (runtime.buildworker)
    local_processes: int | None = None  # this gateway's filter processes (None: the policy's)


@dataclass(frozen=True)
class _Built:
    policy: Policy
    routes: dict[str, RouteEntry]
    services: Services
    keys: dict[str, KeyInfo]


@dataclass(frozen=True)
class Prepared:
    """What the build worker process sends back: the policy and its key table."""

    policy: Policy
    keys: dict[str, KeyInfo]


def prepare(path: Path) -> Loaded[Prepared]:
    """In the build worker process: load, and build every chain once with default services (a
    plugin that refuses its settings is reported from there, before anything is sent)."""
    policy = load_policy(path)
    build_routes(policy, default_services(policy, time.monotonic))
    return Loaded(Prepared(policy, policy_keys(policy)))


class FilterApp:
    def __init__(
        self,
        settings: Settings,
        *,
        clock: Callable[[], float],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self.metrics = FilterMetrics()
        self.policy: Policy = load_policy(settings.policy_path)
        # admission state outlives policy reloads (requests in flight keep their slots)
        self.metrics.configure(self.policy)  # label values folded to the policy's names
        self.gates = Gates(
            clock=clock, wall=wall, registry=self.metrics.registry, rng=random.Random(),
            local=settings.local_processes,
        )  # fmt: skip
        self.gates.configure(self.policy)
        self.balance = LaneBalance(
            self.metrics.registry
        )  # ranked pools: requests in flight per replica and lane
        self.balance.configure(self.policy)
        self.ladders = Ladders(clock=clock, registry=self.metrics.registry)
        self.ladders.configure(self.policy)
        # learned output lengths outlive reloads (reservations read them); windows are numbered
        # from the wall clock, the same in every process that shares them through Redis
        self.lengths = OutputLengths(clock=wall, window=self.policy.reservation.window)
        self._shared_lengths: SharedLengths | None = None
        self.ladders.demand = self.gates.demand  # the ladder reads the gates' queues too
        self.ladders.stepped_down = self.gates.stopped_refusing  # (refused demand: counted once)
        self.ladders.expected = self.gates.expected  # clients back when told: not a new spike
        # endpoint pickers (prefix indexes) outlive reloads too; started in start()
        self.pickers = Pickers(registry=self.metrics.registry, clock=clock, wall=wall)
        # admission's and the ladder's saturation
        self._pool_state = pool_state_reader(self.policy, clock, needed=uses_ladder(self.policy))
        self._estimator: Estimator = load_estimator(settings.tokenizer_file)
        self._redis: Redis | None = None
        self._shared_returns: SharedReturns | None = None
        self._fairshare: FairShare | None = None
        self._valley: ValleyReader | None = None  # the batch runners' lines (the ladder's)
        self._keys: KeyStore | None = None
        self._budget_reader: Budget = NoBudget()
        self.watcher = PolicyWatcher(
            settings.policy_path,
            load=InWorker(prepare, self._finish) if settings.build_worker else self._build,
            apply=self._swap,
            metrics=ReloadMetrics(self.metrics.registry),
            log=_log,
            poll_interval=settings.reload_interval,
            clock=clock,
        )
        self._tasks: list[asyncio.Task[None]] = []
        # collapsed runs outlive policy reloads; followers are streamed by the fan-out endpoint
        self.collapser = Hub(clock)
        self._fanout: FanoutServer | None = None
        self._wall = wall
        self.shadow: ShadowRecorder | None = None  # mirrors of the shadow plugin (started once)
        # registered whether or not a route pairs shadows: the metrics catalog lists them
        self._shadow_metrics = ShadowMetrics(self.metrics.registry)
        self.health = HealthState(["envoy.service.ext_proc.v3.ExternalProcessor"])
        self._metrics_server: MetricsServer | None = None
        self.server: FilterServer | H2FilterServer | None = None
        self.tracing = TracingSwitch("tokenweir-filters")
        self.metrics_port: int | None = None
        # the in-stream stop (usage plugin, stop_at_budget): top-ups once Redis is known, and
        # the backend aborts of streams it ends
        self.topups: TopUps | None = None
        self.aborts = Aborter(self.metrics.backend_aborts, clock=clock)
        # PD pools: pair loads and the prefill calls (filters/plugins/pd)
        self.pd = PdHub(self.metrics.registry, clock=clock)
        self.lora = LoraHub(self.metrics.registry, clock=clock)

    def _redis_url(self) -> str | None:
        if self.settings.redis_url:
            return self.settings.redis_url
        rl = self.policy.ratelimit
        return rl.redis_url if rl is not None else None

    def _key_store(self) -> KeyStore:
        """One store for the life of the server (its answers survive policy reloads)."""
        if self._keys is None:
            self._keys = KeyStore(
                policy_keys(self.policy),
                self._redis,
                clock=self._clock,
                ttl=self.settings.key_cache_seconds,
                negative_ttl=self.settings.key_cache_seconds,
                io_timeout=self._redis_timeout(),
                on_redis_error=self.metrics.redis_errors.inc,
                on_fallback=lambda answer: self.metrics.key_fallbacks.labels(answer).inc(),
            )
        return self._keys

    def _redis_timeout(self) -> float:
        """Half the ext_proc message timeout: a Redis read never outlives the request's turn."""
        mt = self.policy.filters.message_timeout if self.policy.filters is not None else 0.2
        return mt / 2

    def _services(self, policy: Policy | None = None) -> Services:
        """The plugins' services for ``policy`` (the key store is shared across reloads; its
        policy keys are swapped with the chains, in ``_swap``)."""
        policy = policy or self.policy
        keys = self._key_store()
        budget: Budget = NoBudget()
        if self._redis is not None:
            budget = quota_reader_budget(
                self._redis,
                policy,
                clock=self._clock,
                ttl=self.settings.budget_cache_seconds,
                on_error=self.metrics.redis_errors.inc,
            )
        return Services(
            policy,
            keys,
            budget,
            self._estimator,
            self.metrics,
            self._clock,
            self.gates,
            self.ladders,
            self.pickers,
            redis=self._redis,
            collapser=self.collapser,
            shadow=self.shadow,
            balance=self.balance,
            topups=self.topups,
            aborts=self.aborts,
            pd=self.pd,
            lora=self.lora,
            lengths=self.lengths,
        )

    async def start(self) -> None:
        await self._start_pool_state()
        url = self._redis_url()
        if url:
            await verify_credentials(url)  # a wrong password stops the start, clearly
            self._redis = redis_client(url, timeout=self._redis_timeout())
            self.topups = TopUps(self._redis, wall=self._wall, timeout=self._redis_timeout())
            # a Retry-After's promise is kept by whichever filter process the client comes back to
            shared = SharedReturns(self._redis, wall=self._wall, registry=self.metrics.registry)
            self._shared_returns = shared.start()
            self.gates.share_returns(shared)
            # every filter process reserves from every process's answers
            self._shared_lengths = SharedLengths(
                self._redis, self.lengths, clock=self._clock, on_error=self.metrics.redis_errors.inc
            ).start()
            self._valley = ValleyReader(
                self._redis_now, clock=self._clock, wall=self._wall,
                on_error=self.metrics.redis_errors.inc,
            )  # fmt: skip
            self._valley.configure(_valley_pools(self.policy))
            self._valley.start()
        # tenants' token shares of each lane, across filter processes where admission is split
        self._fairshare = FairShare(
            self.gates, self._redis, clock=self._clock, registry=self.metrics.registry
        ).start()
        await self.pickers.configure(self.policy)
        host, port = self._listen()
        if any(uses_collapse(r) for g in self.policy.gateways.values() for r in g.routes):
            knobs = self.policy.collapsing
            self._fanout = FanoutServer(
                self.collapser, host, idle_timeout=knobs.follower_timeout,
                max_buffer_bytes=knobs.max_buffer_bytes, redis=self._redis,
            )  # fmt: skip
            await self._fanout.start()
        if any(uses_shadow_pairs(r) for g in self.policy.gateways.values() for r in g.routes):
            self.shadow = ShadowRecorder(
                host, metrics=self._shadow_metrics, redis=self._redis,
                clock=self._clock, wall=self._wall,
            )  # fmt: skip
            await self.shadow.start()
        services = self._services()
        self._budget_reader = services.budget
        timeout = self.policy.filters.message_timeout if self.policy.filters is not None else 0.2
        await self.tracing.update(self.policy.tracing)  # and on every reload (``_swap``)
        servicer = FilterServicer(
            build_routes(self.policy, services),
            clock=self._clock,
            metrics=self.metrics,
            message_timeout=timeout,
            tracing=self.tracing,
        )
        section = self.policy.filters
        tls = section.tls if section is not None else None
        files = ServerTlsFiles(tls.cert, tls.key, tls.ca) if tls is not None else None
        check_plaintext("filters", host, files, section is not None and section.allow_plaintext)
        transport = transport_for(self.settings.transport, host, tls=files is not None)
        usage_log = UsageLog(  # Envoy's usage meter reports
            self.metrics, lambda: self.policy, self.tracing, on_metered=self._metered
        )
        renewing = None
        if files is not None:
            renewals = self.metrics.tls_renewals
            renewing = RenewingTls(
                files, on_reload=lambda ok: renewals.labels("ok" if ok else "error").inc()
            )
        if transport == "h2":
            body = self.policy.filters.max_body_bytes if self.policy.filters else 1024**2
            limits = replace(LIMITS, max_message=max(4 * 1024**2, body + 64 * 1024))
            self.server = H2FilterServer(
                servicer, host, port, health=self.health, limits=limits, usage_log=usage_log,
                ssl=renewing.context if renewing is not None else None,
                before_handshake=renewing.refresh if renewing is not None else None,
            )  # fmt: skip
        else:
            self.server = FilterServer(
                servicer, host, port, health=self.health, usage_log=usage_log,
                credentials=renewing.grpc_credentials() if renewing is not None else None,
            )  # fmt: skip
        await self.server.start()
        mport = self.settings.metrics_port
        if mport is None and self.policy.filters is not None:
            mport = self.policy.filters.metrics_port
        if mport is not None:
            await self._serve_metrics(host, mport + self.settings.worker_index)
        self.watcher.start()
        _log.info(
            "filter server on %s:%s (routes: %s, transport: %s)",
            host,
            self.server.port,
            servicer.route_count,
            transport,
        )

    async def _start_pool_state(self) -> None:
        """Before serving: the first requests decide on the pool's real saturation (a burst
        at start-up is when it matters), not on the policy's capacity alone. Bounded: a
        control plane that does not answer delays the start by at most ``BOOT_WAIT_S``."""
        if self._pool_state is None:
            return
        self._pool_state.start()
        self.gates.saturation = admission_source(self._pool_state)
        self.gates.alive = alive_source(self._pool_state)
        self.balance.down = down_source(self._pool_state)
        self.gates.ranking = ranking_source(self._pool_state)
        self.gates.capacity = capacity_source(self._pool_state)
        self.gates.ready_in = ready_source(self._pool_state, self.gates.wall)
        # the pool's saturation less the batch runners' lines at its replicas (poolstate/valley.py)
        self.ladders.saturation = ladder_source(self._pool_state, self._valley_lines)
        self._tasks.append(asyncio.create_task(self._follow_capacity(), name="follow-capacity"))
        if not await self._pool_state.first(BOOT_WAIT_S):
            _log.warning(
                "no pool state after %.1fs (%s): admitting on the policy's capacity until it "
                "answers (a pool that declares none is not limited until then)",
                BOOT_WAIT_S, self._pool_state.url,
            )  # fmt: skip

    async def _redis_now(self) -> Redis | None:
        return self._redis

    def _valley_lines(self, pool: str) -> int:
        return self._valley.lines(pool) if self._valley is not None else 0

    async def _follow_capacity(self) -> None:
        """Each new pool state (or every 5 s) sets the admission limit, and its gauge, of the
        pools that declare no capacity: requests read the limit, they do not recompute it."""
        assert self._pool_state is not None
        while True:
            await self._pool_state.wait_update(5.0)
            self.gates.follow_reported()

    def _metered(self, fields: Mapping[str, object]) -> None:
        """One request Envoy's usage meter covered (its access log entry's ``tokenweir``
        fields): the picker's predicted-vs-actual, the answer's length (learned output
        lengths), and the tokens its tenant was served (its share of the lane)."""
        pool, tenant, model = fields.get("pool"), fields.get("tenant"), fields.get("model")
        lane = fields.get("lane")
        prompt, completion = fields.get("prompt_tokens"), fields.get("completion_tokens")
        if isinstance(pool, str):
            self.pickers.metered(pool, fields)
        if not isinstance(completion, float):
            return  # no usage reported
        if isinstance(tenant, str) and isinstance(model, str):
            self.lengths.observe(tenant, model, int(completion))
        if isinstance(pool, str):
            tokens = completion + (prompt if isinstance(prompt, float) else 0.0)
            self.gates.settled(
                pool, lane if isinstance(lane, str) else None,
                tenant if isinstance(tenant, str) else None, tokens,
            )  # fmt: skip

    def _listen(self) -> tuple[str, int]:
        if self.settings.listen:
            host, _, port = self.settings.listen.rpartition(":")
            return host or "127.0.0.1", int(port)
        addr = self.policy.filters.address if self.policy.filters is not None else None
        return (addr.host, addr.port) if addr is not None else ("127.0.0.1", 18082)

    async def _serve_metrics(self, host: str, port: int) -> None:
        server = MetricsServer(
            self.metrics.registry, host, port, health=self.health,
            token=admin_token(os.environ), tls=admin_tls(os.environ),
        )  # fmt: skip
        self.metrics_port = await server.start()
        self._metrics_server = server

    def _build(self, path: Path) -> Loaded[_Built]:
        """Load the policy and build every chain (in a thread, without a build worker)."""
        policy = load_policy(path)
        services = self._services(policy)
        return Loaded(_Built(policy, build_routes(policy, services), services, policy_keys(policy)))

    def _finish(self, prepared: Prepared) -> Generator[None, None, _Built]:
        """On the loop, after the build worker: the chains with this process's services, a few
        routes at a time (the watcher lets requests run at each ``yield``)."""
        services = self._services(prepared.policy)
        routes: dict[str, RouteEntry] = {}
        for name, entry in iter_routes(prepared.policy, services):
            routes[name] = entry
            if len(routes) % 8 == 0:
                yield
        return _Built(prepared.policy, routes, services, prepared.keys)

    def _swap(self, built: _Built) -> None:
        """On the loop: new streams get the new chains; open streams keep the ones they have."""
        self.policy = built.policy
        if self._keys is not None:
            self._keys.update_fallback(built.keys)
        self._budget_reader = built.services.budget
        self.metrics.configure(built.policy)
        self.gates.configure(built.policy)
        self.balance.configure(built.policy)
        self.ladders.configure(built.policy)
        if self._valley is not None:
            self._valley.configure(_valley_pools(built.policy))
        self.lengths.configure(built.policy.reservation.window)
        self.tracing.apply(built.policy.tracing)  # built off the loop, swapped whole
        if self.server is not None:
            self.server.servicer.swap(built.routes)
        self._tasks.append(
            asyncio.create_task(self.pickers.configure(built.policy), name="pickers-configure")
        )
        _log.info("policy reloaded: %d filtered routes", len(built.routes))

    async def reload(self) -> ReloadOutcome:
        """Load the policy file again (off the loop); keep the running chains when it is bad."""
        return await self.watcher.reload()

    async def drain(self, timeout: float) -> None:
        """NOT_SERVING first; new streams refused; those in flight get up to ``timeout`` s."""
        self.health.shutdown()
        server = self.server
        if isinstance(server, FilterServer):
            left = await server.drain(timeout)
        elif server is not None:  # h2: health keeps answering; new streams get UNAVAILABLE
            left = await server.servicer.inflight.drain(timeout)
        else:
            left = 0
        if left:
            _log.warning("drain timeout (%.0fs): %d stream(s) still open are cut", timeout, left)

    async def aclose(self) -> None:
        await self.watcher.aclose()
        for t in self._tasks:
            await stop_task(t, log=_log)
        self._tasks.clear()
        try:  # a stuck picker must not keep the process from exiting
            await asyncio.wait_for(self.pickers.aclose(), 5.0)
        except TimeoutError:
            _log.error("pickers did not stop within 5 s; exiting anyway")
        if self._pool_state is not None:
            await self._pool_state.aclose()
        if self._metrics_server is not None:
            await self._metrics_server.aclose()
            self._metrics_server = None
        if self.server is not None:
            await self.server.aclose()
            self.server = None
        if self._fanout is not None:
            await self._fanout.aclose()
            self._fanout = None
        if self.shadow is not None:
            await self.shadow.aclose()
            self.shadow = None
        await self.aborts.aclose()
        await self.pd.aclose()
        await self.lora.aclose()
        await self.tracing.aclose()
        if isinstance(self._budget_reader, CachedBudget):
            await self._budget_reader.aclose()
        if self._keys is not None:
            await self._keys.aclose()
            self._keys = None
        if self._shared_lengths is not None:
            await self._shared_lengths.aclose()
            self._shared_lengths = None
        if self._fairshare is not None:
            await self._fairshare.aclose()
            self._fairshare = None
        if self._valley is not None:
            await self._valley.aclose()
            self._valley = None
        if self._shared_returns is not None:
            self.gates.share_returns(None)
            await self._shared_returns.aclose()
            self._shared_returns = None
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None


def _valley_pools(policy: Policy) -> tuple[str, ...]:
    """The batch runners' pool, where it has a degradation ladder: its runners' lines are read
    (poolstate/valley.py)."""
    pool = runner_pool(policy)
    return (pool,) if pool is not None and policy.pools[pool].degradation is not None else ()
