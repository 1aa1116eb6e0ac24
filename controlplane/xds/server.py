"""The ADS gRPC server: State-of-the-World and Delta streams fed from a ``SnapshotCache``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence
from typing import Protocol, TypeAlias

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf.message import Message
from prometheus_client import CollectorRegistry

from controlplane.xds.cache import SnapshotCache
from controlplane.xds.delta import DeltaSession
from controlplane.xds.errors import XdsError
from controlplane.xds.metrics import XdsMetrics
from controlplane.xds.session import Recorder, Session
from controlplane.xds.sotw import SotwSession
from controlplane.xds.status import NodeStatus, node_status

__all__ = ["AdsServicer", "XdsServer"]

log = logging.getLogger(__name__)

Clock = Callable[[], float]
# a stream's responses, then None once either side has ended it
_Outbox = asyncio.Queue[Message | None]
# what a stream carries: the requests and responses of either ADS variant
_Discovery: TypeAlias = (
    discovery_pb2.DiscoveryRequest
    | discovery_pb2.DiscoveryResponse
    | discovery_pb2.DeltaDiscoveryRequest
    | discovery_pb2.DeltaDiscoveryResponse
)


class _SessionFactory(Protocol):
    def __call__(
        self, node: base_pb2.Node, group: str, *, recorder: Recorder, clock: Clock
    ) -> Session[Message]: ...


class AdsServicer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    """Serves ADS streams; reads snapshots from the cache, never writes them."""

    def __init__(self, cache: SnapshotCache, metrics: XdsMetrics, *, clock: Clock) -> None:
        self._cache = cache
        self._metrics = metrics
        self._clock = clock
        self.sessions: set[Session[Message]] = set()  # open streams, for status pages

    async def StreamAggregatedResources(
        self,
        request_iterator: AsyncIterable[discovery_pb2.DiscoveryRequest],
        context: grpc.aio.ServicerContext[
            discovery_pb2.DiscoveryRequest, discovery_pb2.DiscoveryResponse
        ]
        | None = None,
    ) -> AsyncIterator[discovery_pb2.DiscoveryResponse]:
        async for response in self._serve(request_iterator, SotwSession):
            yield response

    async def DeltaAggregatedResources(
        self,
        request_iterator: AsyncIterable[discovery_pb2.DeltaDiscoveryRequest],
        context: grpc.aio.ServicerContext[
            discovery_pb2.DeltaDiscoveryRequest, discovery_pb2.DeltaDiscoveryResponse
        ]
        | None = None,
    ) -> AsyncIterator[discovery_pb2.DeltaDiscoveryResponse]:
        async for response in self._serve(request_iterator, DeltaSession):
            yield response

    async def _serve(
        self, requests: AsyncIterable[Message], factory: _SessionFactory
    ) -> AsyncIterator[Message]:
        iterator = aiter(requests)
        try:
            first = await anext(iterator)
        except StopAsyncIteration:
            return
        node: base_pb2.Node = first.node  # type: ignore[attr-defined]  # the stream's messages are typed as Message; every discovery request has node
        group = self._cache.group_of(node)
        session = factory(node, group, recorder=self._metrics, clock=self._clock)
        outbox: _Outbox = asyncio.Queue()
        _emit(outbox, session.on_request(first))
        reader = asyncio.create_task(self._read(iterator, session, outbox))
        watcher = asyncio.create_task(self._watch(group, session, outbox))
        gauge = self._metrics.connected.labels(group, session.mode)
        gauge.inc()
        self.sessions.add(session)
        log.info("node %r (group %r) connected over %s ADS", node.id, group, session.mode)
        try:
            while (item := await outbox.get()) is not None:
                yield item
        finally:
            gauge.dec()
            self.sessions.discard(session)
            for task in (reader, watcher):
                task.cancel()
            for outcome in await asyncio.gather(reader, watcher, return_exceptions=True):
                if isinstance(outcome, Exception):
                    log.error("ADS stream of node %r failed", node.id, exc_info=outcome)
            log.info("node %r (group %r) disconnected", node.id, group)

    @staticmethod
    async def _read(
        iterator: AsyncIterator[Message], session: Session[Message], outbox: _Outbox
    ) -> None:
        try:
            async for request in iterator:
                responses = session.on_request(request)
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("%s <- %s", session.node.id, _describe(request))
                    for response in responses:
                        log.debug("%s -> %s", session.node.id, _describe(response))
                _emit(outbox, responses)
        finally:
            outbox.put_nowait(None)  # the stream ends with Envoy's side (or with an error)

    async def _watch(self, group: str, session: Session[Message], outbox: _Outbox) -> None:
        try:
            seen = 0
            while True:
                seen, snapshot = await self._cache.wait_newer(group, seen)
                responses = session.on_snapshot(snapshot)
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("%s: snapshot %s", session.node.id, snapshot.version)
                    for response in responses:
                        log.debug("%s -> %s", session.node.id, _describe(response))
                _emit(outbox, responses)
        except Exception:
            outbox.put_nowait(None)
            raise


def _describe(message: _Discovery) -> str:
    """One log line for a request or response (type, nonce, names, error), for DEBUG logs."""
    fields = {f.name for f in message.DESCRIPTOR.fields}
    parts = [message.type_url.rsplit(".", 1)[-1]]
    for name in ("nonce", "response_nonce", "version_info", "system_version_info"):
        if name in fields and getattr(message, name):
            parts.append(f"{name}={getattr(message, name)}")
    for name in ("resource_names", "resource_names_subscribe", "resource_names_unsubscribe"):
        if name in fields and getattr(message, name):
            parts.append(f"{name}={sorted(getattr(message, name))}")
    if "resources" in fields:
        parts.append(f"resources={len(message.resources)}")
    if "removed_resources" in fields and message.removed_resources:
        parts.append(f"removed={sorted(message.removed_resources)}")
    if "error_detail" in fields and message.HasField("error_detail"):
        parts.append(f"error={message.error_detail.message!r}")
    return " ".join(parts)


def _emit(outbox: _Outbox, responses: list[Message]) -> None:
    for response in responses:
        outbox.put_nowait(response)


class XdsServer:
    """The gRPC server hosting :class:`AdsServicer`; ``start`` binds, ``aclose`` stops."""

    def __init__(
        self,
        cache: SnapshotCache,
        *,
        registry: CollectorRegistry,
        clock: Clock = time.monotonic,
        metrics: XdsMetrics | None = None,
        services: Sequence[Callable[[grpc.aio.Server], None]] = (),
    ) -> None:
        """``services``: more gRPC services to host on the same server (the caller adds
        ``grpc.health.v1.Health`` this way; the xDS core imports no runtime)."""
        self.cache = cache
        self._services = tuple(services)
        self.metrics = metrics or XdsMetrics(registry)
        self.servicer = AdsServicer(cache, self.metrics, clock=clock)
        self._clock = clock
        self._server: grpc.aio.Server | None = None
        self.port = 0
        for group, snapshot in cache.groups().items():
            self.metrics.published(group, snapshot)
        cache.add_listener(self.metrics.published)

    def nodes(self) -> list[NodeStatus]:
        """What every connected Envoy holds, type by type (``controlplane.xds.status``)."""
        return sorted(
            (node_status(s, self._clock()) for s in self.servicer.sessions),
            key=lambda n: (n["group"], n["node"]),
        )

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Bind and serve; returns the bound port."""
        if self._server is not None:
            raise XdsError("the xDS server is already started")
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                ("grpc.max_send_message_length", 256 * 1024 * 1024),
                ("grpc.so_reuseport", 0),
            ]
        )
        ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(self.servicer, server)
        for add in self._services:
            add(server)
        try:
            bound = server.add_insecure_port(f"{host}:{port}")
        except RuntimeError as exc:
            raise XdsError(f"cannot bind the xDS server to {host}:{port}: {exc}") from exc
        await server.start()
        self._server = server
        self.port = bound
        log.info("xDS (ADS, SotW and Delta) listening on %s:%d", host, bound)
        return bound

    async def aclose(self, grace: float | None = 0.5) -> None:
        """Stop serving; open streams are cancelled (Envoys keep their config and reconnect)."""
        self.cache.remove_listener(self.metrics.published)
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)
