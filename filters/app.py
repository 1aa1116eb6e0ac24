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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.policy import Policy, PolicyError, load_policy
from filters.budget import Budget, CachedBudget, NoBudget, quota_reader_budget
from filters.estimate import Estimator, load_estimator
from filters.h2server import H2FilterServer
from filters.keys import KeyStore, policy_keys
from filters.metrics import FilterMetrics
from filters.redis_pool import redis_client
from filters.registry import build_routes
from filters.server import FilterServer, FilterServicer
from filters.services import Services
from runtime.health import HealthState
from runtime.metrics_http import MetricsServer
from runtime.tasks import stop_task

__all__ = ["FilterApp", "Settings"]

_log = logging.getLogger(__name__)


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


class FilterApp:
    def __init__(self, settings: Settings, *, clock: Callable[[], float]) -> None:
        self.settings = settings
        self._clock = clock
        self.metrics = FilterMetrics()
        self.policy: Policy = load_policy(settings.policy_path)
        self._estimator: Estimator = load_estimator(settings.tokenizer_file)
        self._redis: Any = None
        self._keys: KeyStore | None = None
        self._budget_reader: Budget = NoBudget()
        self._mtime = self._stat()
        self._tasks: list[asyncio.Task[None]] = []
        self.health = HealthState(["envoy.service.ext_proc.v3.ExternalProcessor"])
        self._metrics_server: MetricsServer | None = None
        self.server: FilterServer | H2FilterServer | None = None
        self.metrics_port: int | None = None

    def _stat(self) -> float:
        try:
            return os.stat(self.settings.policy_path).st_mtime
        except OSError:
            return 0.0

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
        else:
            self._keys.update_fallback(policy_keys(self.policy))
        return self._keys

    def _redis_timeout(self) -> float:
        """Half the ext_proc message timeout: a Redis read never outlives the request's turn."""
        mt = self.policy.filters.message_timeout if self.policy.filters is not None else 0.2
        return mt / 2

    def _services(self) -> Services:
        keys = self._key_store()
        budget: Budget = NoBudget()
        if self._redis is not None:
            budget = quota_reader_budget(
                self._redis,
                self.policy,
                clock=self._clock,
                ttl=self.settings.budget_cache_seconds,
                on_error=self.metrics.redis_errors.inc,
            )
            self._budget_reader = budget
        return Services(self.policy, keys, budget, self._estimator, self.metrics, self._clock)

    async def start(self) -> None:
        url = self._redis_url()
        if url:
            self._redis = redis_client(url, timeout=self._redis_timeout())
        services = self._services()
        servicer = FilterServicer(
            build_routes(self.policy, services), clock=self._clock, metrics=self.metrics
        )
        host, port = self._listen()
        if self.settings.transport == "h2":
            self.server = H2FilterServer(servicer, host, port)
        else:
            self.server = FilterServer(servicer, host, port, health=self.health)
        await self.server.start()
        mport = self.settings.metrics_port
        if mport is None and self.policy.filters is not None:
            mport = self.policy.filters.metrics_port
        if mport is not None:
            await self._serve_metrics(host, mport + self.settings.worker_index)
        self._tasks.append(asyncio.create_task(self._watch()))
        _log.info(
            "filter server on %s:%s (routes: %s, transport: %s)",
            host,
            self.server.port,
            servicer.route_count,
            self.settings.transport,
        )

    def _listen(self) -> tuple[str, int]:
        if self.settings.listen:
            host, _, port = self.settings.listen.rpartition(":")
            return host or "127.0.0.1", int(port)
        addr = self.policy.filters.address if self.policy.filters is not None else None
        return (addr.host, addr.port) if addr is not None else ("127.0.0.1", 18082)

    async def _serve_metrics(self, host: str, port: int) -> None:
        server = MetricsServer(self.metrics.registry, host, port, health=self.health)
        self.metrics_port = await server.start()
        self._metrics_server = server

    def reload(self) -> bool:
        """Load the policy file again; keep the running chains when it is invalid."""
        try:
            policy = load_policy(self.settings.policy_path)
        except (PolicyError, OSError) as exc:
            _log.error("policy reload failed, keeping the running policy: %s", exc)
            return False
        old = self.policy
        self.policy = policy
        try:
            routes = build_routes(policy, self._services())
        except Exception as exc:
            self.policy = old
            _log.error("policy reload failed (plugins), keeping the running policy: %s", exc)
            return False
        if self.server is not None:
            self.server.servicer.swap(routes)
        _log.info("policy reloaded: %d filtered routes", len(routes))
        return True

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reload_interval)
            mtime = self._stat()
            if mtime != self._mtime:
                self._mtime = mtime
                self.reload()

    async def drain(self, timeout: float) -> None:
        """NOT_SERVING first; new streams refused; those in flight get up to ``timeout`` s."""
        self.health.shutdown()
        server = self.server
        if isinstance(server, FilterServer):
            left = await server.drain(timeout)
        elif server is not None:
            await server.aclose(timeout)  # GOAWAY, then the streams in flight finish
            self.server = None
            left = 0
        else:
            left = 0
        if left:
            _log.warning("drain timeout (%.0fs): %d stream(s) still open are cut", timeout, left)

    async def aclose(self) -> None:
        for t in self._tasks:
            await stop_task(t, log=_log)
        self._tasks.clear()
        if self._metrics_server is not None:
            await self._metrics_server.aclose()
            self._metrics_server = None
        if self.server is not None:
            await self.server.aclose()
            self.server = None
        if isinstance(self._budget_reader, CachedBudget):
            await self._budget_reader.aclose()
        if self._keys is not None:
            await self._keys.aclose()
            self._keys = None
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None
