"""One service process: the gRPC RateLimitService, /metrics, and the policy file watcher.

``drain(timeout)`` reports NOT_SERVING (``grpc.health.v1.Health``, ``/healthz``) and stops the
gRPC server: no new calls, calls in flight finish within ``timeout``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf.message import DecodeError
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from policy import Policy, load_policy
from policy.model import RateLimitServer
from ratelimit_service.decider import CallTrace, Decider, DeciderSettings
from ratelimit_service.directory import QuotaDirectory, SeedPlan, seed_defaults, seed_plan
from ratelimit_service.h2server import H2Server
from ratelimit_service.health import RedisHealth
from ratelimit_service.metrics import Metrics
from ratelimit_service.resp import fast_path_url
from ratelimit_service.responses import error_response, ok_response
from ratelimit_service.store import RedisStore
from ratelimit_service.tracing import end_call_span
from runtime.admin_auth import admin_tls, admin_token
from runtime.grpc_health import AioHealth
from runtime.h2 import transport_for
from runtime.health import HealthState
from runtime.metrics_http import MetricsServer
from runtime.redis_connect import connect_redis, redacted
from runtime.tasks import honour_cancel, stop_task
from runtime.tls_server import RenewingTls, ServerTlsFiles, check_plaintext
from runtime.tracing import Tracing, TracingSwitch
from runtime.watcher import InWorker, Loaded, PolicyWatcher, ReloadMetrics

__all__ = ["RateLimitServicer", "Service", "ServiceSettings", "decider_settings", "prepare"]

log = logging.getLogger(__name__)
# Seeding after a reload, while serving: pipelines of 50, then Redis and the loop are left to the
# decisions as long again (a 10k-tenant seed takes seconds; nothing waits for it). With 20 and
# twice as long, a shutdown during the (longer) seeding hung twice in the reload test: unexplained.
SEED_BATCH, SEED_REST = 50, 1.0


@dataclass(frozen=True)
class ServiceSettings:
    """Everything a process needs; read once by the entry point (``__main__``)."""

    policy_path: Path
    redis_url: str | None = None
    listen: str | None = None  # host:port; default: the policy's ratelimit.address
    metrics_port: int | None = None
    worker_index: int = 0
    reload_interval: float = 1.0
    quota_cache_ttl: float = 0.5
    transport: str = "h2"  # "h2" (h2server.py: one method, ~4x less CPU) or "grpc" (grpc.aio)
    instances: int | None = None  # services side by side; default: the policy's replicas.ratelimit
    # reloads build in a child process (runtime.buildworker), so the build never holds the
    # GIL the decisions need. It was off for a while: a service stopped right after a
    # 10k-tenant reload hung 4 of 9 times. The cause was not the worker but the Redis seeder:
    # redis-py's pipeline swallowed the cancel SIGTERM sent mid-seed, so the close waited on
    # the seeder forever (runtime.tasks now cancels again, and the seeder honours the request).
    build_worker: bool = True


def decider_settings(rl: RateLimitServer, instances: int = 1) -> DeciderSettings:
    """``instances``: rate-limit services side by side (``replicas.ratelimit``), each running
    ``rl.replicas`` processes; the local fallback bucket holds 1/(both) of every limit."""
    return DeciderSettings(
        domain=rl.domain,
        failure_mode=rl.redis_failure_mode,
        deadline=max(0.002, rl.timeout * 0.6),
        reservation_ttl_ms=int(rl.reservation_ttl * 1000),
        replicas=rl.replicas * instances,
    )


@dataclass(frozen=True)
class _Built:
    policy: Policy
    settings: DeciderSettings
    seed: SeedPlan | None


def prepare(path: Path) -> Loaded[_Built]:
    """In the build worker process: the policy, the decider's settings and the seeding plan."""
    policy = load_policy(path, gateway_files=False)  # no gateway key here (policy.tls)
    settings = decider_settings(policy.ratelimit or RateLimitServer())
    return Loaded(_Built(policy, settings, seed_plan(policy)))


Metadata = Iterable[tuple[str, str]]


class CallContext(Protocol):
    """What the servicer reads of grpc.aio's ``ServicerContext``: the call's metadata."""

    def invocation_metadata(self) -> Metadata | None: ...


class RateLimitServicer(rls_pb2_grpc.RateLimitServiceServicer):
    """gRPC boundary: every answer comes from the Decider; an unexpected error is logged, counted
    and answered per the failure mode (never a gRPC error Envoy would silently fail open on)."""

    def __init__(self, decider: Decider, tracing: TracingSwitch | Tracing | None = None) -> None:
        self.decider = decider
        # current None: no span, no propagator on the hot path (it follows policy reloads)
        self.tracing = (
            tracing if isinstance(tracing, TracingSwitch) else TracingSwitch.fixed(tracing)
        )

    async def ShouldRateLimit(
        self, request: rls_pb2.RateLimitRequest, context: CallContext | None
    ) -> rls_pb2.RateLimitResponse:
        tracer = self.tracing.current
        if tracer is None:
            return await self._decide(request)
        meta = (context.invocation_metadata() or ()) if context is not None else ()
        return await self._traced(tracer, request, meta)

    async def _traced(
        self, tracer: Tracing, request: rls_pb2.RateLimitRequest, metadata: Metadata
    ) -> rls_pb2.RateLimitResponse:
        """A span for the call: a child of its ``traceparent``; a call without one (Envoy 1.40's
        stream-done settlement) gets one only when its reservation kept the request's."""
        incoming = next((v for k, v in metadata if k == "traceparent"), None)
        trace = CallTrace(incoming)
        name = "ratelimit ShouldRateLimit"
        started = time.time_ns()
        span = tracer.start(name, metadata) if incoming is not None else None
        response: rls_pb2.RateLimitResponse | None = None
        try:
            response = await self._decide(request, trace)
        finally:  # a call Envoy gave up on (its timeout) is cancelled: its span ends too
            if span is None and trace.settled is not None:
                span = tracer.start(name, (("traceparent", trace.settled),), None, started)
            if span is not None:
                end_call_span(span, request, response)
        return response

    async def _decide(
        self, request: rls_pb2.RateLimitRequest, trace: CallTrace | None = None
    ) -> rls_pb2.RateLimitResponse:
        try:
            return await self.decider.decide(request, trace)
        except Exception:
            log.exception("internal error while deciding")
            self.decider.metrics.decisions.labels("internal_error", "").inc()
            if self.decider.settings.failure_mode == "open":
                return ok_response([])
            return error_response(
                "Internal error in the quota service.", "internal_error", "server_error", 1
            )

    def _parse(self, message: bytes) -> rls_pb2.RateLimitRequest:
        try:
            return rls_pb2.RateLimitRequest.FromString(message)
        except DecodeError:
            log.warning("undecodable RateLimitRequest (%d bytes)", len(message))
            self.decider.metrics.bad_requests.labels("undecodable").inc()
            return rls_pb2.RateLimitRequest()  # answered as missing descriptors

    async def handle_bytes(self, message: bytes) -> bytes:
        """The same method for the h2 transport: serialized request in, serialized answer out."""
        response = await self._decide(self._parse(message))
        return response.SerializeToString()

    async def handle_bytes_traced(
        self, message: bytes, metadata: tuple[tuple[str, str], ...]
    ) -> bytes:
        """``handle_bytes`` with the call's metadata (the h2 transport): a span while tracing
        is on (``tracing.current``), the plain path while it is off."""
        tracer = self.tracing.current
        if tracer is None:
            response = await self._decide(self._parse(message))
        else:
            response = await self._traced(tracer, self._parse(message), metadata)
        return response.SerializeToString()


class Service:
    """Start with ``start()``, stop with ``aclose()``; ``port`` is the bound gRPC port."""

    def __init__(self, settings: ServiceSettings, policy: Policy) -> None:
        self.settings = settings
        self.policy = policy
        self.metrics = Metrics()
        self.metrics.configure(policy)  # label values folded to the policy's names
        self.redis: Redis | RedisCluster | None = None
        self.store: RedisStore | None = None
        self.health: RedisHealth | None = None
        self.decider: Decider | None = None
        self.tracing = TracingSwitch("tokenweir-ratelimit")
        self.server: grpc.aio.Server | None = None
        self.h2: H2Server | None = None
        self.port = 0
        self.metrics_port: int | None = None
        self.serving = HealthState(["envoy.service.ratelimit.v3.RateLimitService"])
        self._metrics_server: MetricsServer | None = None
        self.watcher = PolicyWatcher(
            settings.policy_path,
            load=InWorker(prepare, self._finish) if settings.build_worker else self._build,
            apply=self._swap,
            metrics=ReloadMetrics(self.metrics.registry),
            log=log,
            poll_interval=settings.reload_interval,
        )
        self._seed_wanted = asyncio.Event()
        self._seed: SeedPlan | None = None  # computed off the loop with the policy
        self._seeder: asyncio.Task[None] | None = None

    def _rl(self) -> RateLimitServer:
        return self.policy.ratelimit or RateLimitServer()

    async def start(self) -> None:
        rl = self._rl()
        url = self.settings.redis_url or rl.redis_url
        if url:
            redis: Redis | RedisCluster = await connect_redis(url)
            self.redis = redis
            self.store = RedisStore(
                redis,
                deadline=decider_settings(rl).deadline,
                observe=self.metrics.observe_batch,
                fast_url=None if isinstance(redis, RedisCluster) else fast_path_url(url),
            )
            self.health = RedisHealth(redis.ping, self.metrics)
            try:  # pipelined: 10k tenants take well under a second
                await seed_defaults(redis, self.policy)
            except Exception as exc:  # Redis down: the seeder retries in the background
                log.warning("seeding quota defaults deferred: %s", exc)
                self._seed_wanted.set()
        health = self.health
        directory = QuotaDirectory(
            self.policy,
            self.store.hgetall if self.store is not None else None,
            ttl=self.settings.quota_cache_ttl,
            available=(lambda: health.up) if health else (lambda: True),
        )
        self.decider = Decider(
            decider_settings(rl, self._instances(self.policy)),
            directory=directory,
            store=self.store,
            health=self.health,
            metrics=self.metrics,
        )
        await self.tracing.update(self.policy.tracing)  # and on every reload (``_swap``)
        servicer = RateLimitServicer(self.decider, self.tracing)
        listen = self.settings.listen or str(rl.address)
        host, _, port = listen.rpartition(":")
        tls = rl.tls
        files = ServerTlsFiles(tls.cert, tls.key, tls.ca) if tls is not None else None
        check_plaintext("ratelimit", host, files, rl.allow_plaintext)
        transport = transport_for(self.settings.transport, host, tls=files is not None)
        renewing = None
        if files is not None:
            renewals = self.metrics.tls_renewals
            renewing = RenewingTls(
                files, on_reload=lambda ok: renewals.labels("ok" if ok else "error").inc()
            )
        if transport == "h2":
            traced = servicer.handle_bytes_traced  # it checks whether tracing is on per call
            self.h2 = H2Server(servicer.handle_bytes, health=self.serving, traced=traced)
            self.port = await self.h2.start(
                host.strip("[]"), int(port),
                ssl=renewing.context if renewing is not None else None,
                before_handshake=renewing.refresh if renewing is not None else None,
            )  # fmt: skip
        else:
            self.server = grpc.aio.server(options=[("grpc.so_reuseport", 1)])
            rls_pb2_grpc.add_RateLimitServiceServicer_to_server(servicer, self.server)
            aio_health = AioHealth(self.serving)
            aio_health.add_to(self.server)
            await aio_health.sync()
            if renewing is not None:  # mTLS with Envoy
                self.port = self.server.add_secure_port(listen, renewing.grpc_credentials())
            else:
                self.port = self.server.add_insecure_port(listen)
            await self.server.start()
        await self._start_metrics(rl)
        self.watcher.start()
        self._seeder = asyncio.get_running_loop().create_task(
            self._seed_loop(), name="quota-seeder"
        )
        log.info(
            "rate-limit service on port %d (transport %s, redis %s)",  # password redacted
            self.port,
            transport,
            redacted(url) if url else "none",
        )

    async def _start_metrics(self, rl: RateLimitServer) -> None:
        port = self.settings.metrics_port or rl.metrics_port
        if port is None:
            return
        # beside the gRPC port (--listen): the policy's address may be a Service name that
        # resolves to other pods (Kubernetes)
        host = (self.settings.listen or str(rl.address)).rpartition(":")[0].strip("[]")
        server = MetricsServer(
            self.metrics.registry,
            host,
            port + self.settings.worker_index,
            health=self.serving,
            token=admin_token(os.environ),
            tls=admin_tls(os.environ),
        )
        self.metrics_port = await server.start()
        self._metrics_server = server

    def _instances(self, policy: Policy) -> int:
        return self.settings.instances or policy.replicas.ratelimit

    def _build(self, path: Path) -> Loaded[_Built]:
        """Load the policy, the decider's settings and the Redis seeding plan (in the watcher's
        worker thread)."""
        policy = load_policy(path, gateway_files=False)  # no gateway key here (policy.tls)
        settings = decider_settings(policy.ratelimit or RateLimitServer(), self._instances(policy))
        return Loaded(_Built(policy, settings, seed_plan(policy) if self.redis else None))

    def _finish(self, built: _Built) -> _Built:
        return built if self.redis else _Built(built.policy, built.settings, None)

    def _swap(self, built: _Built) -> None:
        """On the loop: later decisions use the new quotas; Redis is seeded in the background."""
        self.policy = built.policy
        self.metrics.configure(built.policy)
        self.tracing.apply(built.policy.tracing)  # built off the loop, swapped whole
        if self.decider is not None:
            self.decider.settings = built.settings
            if self.store is not None:
                self.store.deadline = built.settings.deadline
            self.decider.directory.update_policy(self.policy)
        self._seed = built.seed
        self._seed_wanted.set()
        log.info("policy reloaded: %d tenants", len(self.policy.tenants))

    async def _seed_loop(self) -> None:
        """Copy the policy's quota defaults into Redis after each reload (retried while Redis
        is down; live edits are never overwritten; a reload during seeding seeds again)."""
        while True:
            await self._seed_wanted.wait()
            self._seed_wanted.clear()
            if self.redis is None:
                continue
            if self.health is None or self.health.up:
                try:
                    await seed_defaults(
                        self.redis, self.policy, plan=self._seed, batch=SEED_BATCH, rest=SEED_REST
                    )
                    continue
                except Exception as exc:  # Redis down: retried after a pause
                    honour_cancel()  # or a stop redis-py turned into an error
                    log.debug("seeding deferred: %s", exc)
            self._seed_wanted.set()
            await asyncio.sleep(self.settings.reload_interval)

    async def drain(self, timeout: float) -> None:
        """NOT_SERVING first, then no new calls; calls in flight get up to ``timeout`` s."""
        self.serving.shutdown()
        server, self.server = self.server, None
        if server is not None:
            await server.stop(grace=timeout)
        h2, self.h2 = self.h2, None
        if h2 is not None:
            await h2.aclose(timeout)

    async def aclose(self) -> None:
        await self.watcher.aclose()
        if self.decider is not None:
            await self.decider.aclose()
        await stop_task(self._seeder, log=log)
        self._seeder = None
        await self.drain(1.0)
        if self._metrics_server is not None:
            await self._metrics_server.aclose()
        if self.health is not None:
            await self.health.aclose()
        if self.store is not None:
            await self.store.aclose()
        if self.redis is not None:
            await self.redis.aclose()
        await self.tracing.aclose()
