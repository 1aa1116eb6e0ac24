"""An HTTP/2 (h2c) transport for the ext_proc ``Process`` bidi stream, without grpc.aio.

Why: grpc.aio costs ~0.5 ms of CPU per ext_proc stream (thread hand-offs, per-message syscalls),
half of the filter server's budget. Envoy multiplexes every stream on a few HTTP/2 connections;
the shared HTTP/2 layer (:mod:`runtime.h2`) reads them with one syscall, runs each stream's
:meth:`FilterServicer.Process` as a task on the event loop and writes everything produced in one
loop iteration with one syscall. Each stream gets a :class:`StreamContext` (``read``, ``write``,
``invocation_metadata``). It also answers ``grpc.health.v1.Health`` and Envoy's gRPC access log
(``StreamAccessLogs``: the usage meter's metrics, :mod:`filters.usage_log`).
"""

from __future__ import annotations

from collections.abc import Callable
from ssl import SSLContext

from filters.h2stream import EOF, StreamContext
from filters.server import FilterServicer
from filters.usage_log import ALS_PATH, UsageLog
from runtime.h2 import GrpcH2Server, Limits, Method, Stream
from runtime.health import HealthState

__all__ = ["EOF", "LIMITS", "PROCESS_PATH", "H2FilterServer", "StreamContext"]

PROCESS_PATH = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
# an ext_proc stream lives as long as its HTTP request (a whole generation): more of them at once
LIMITS = Limits(max_concurrent_streams=10_000)


class H2FilterServer:
    """Same interface as :class:`filters.server.FilterServer`: ``start()``, ``aclose()``."""

    def __init__(
        self,
        servicer: FilterServicer,
        host: str,
        port: int,
        *,
        health: HealthState | None = None,
        limits: Limits | None = None,
        usage_log: UsageLog | None = None,
        ssl: SSLContext | None = None,
        before_handshake: Callable[[], object] | None = None,
    ) -> None:
        """``ssl``: serve mTLS (runtime.tls_server.server_context); ``before_handshake``: what
        loads a renewed certificate (runtime.tls_server.RenewingTls.refresh)."""
        self.servicer = servicer
        self.ssl = ssl
        self.before_handshake = before_handshake
        self.host = host
        self.port = port
        methods = {PROCESS_PATH: Method(streaming=self._process)}
        if usage_log is not None:
            methods[ALS_PATH] = Method(streaming=self._access_log)
        self.usage_log = usage_log
        self.grpc = GrpcH2Server(
            methods,
            health=health,
            limits=limits or LIMITS,
        )

    async def start(self) -> None:
        self.port = await self.grpc.start(
            self.host, self.port, ssl=self.ssl, before_handshake=self.before_handshake
        )

    async def aclose(self, grace: float = 1.0) -> None:
        await self.grpc.aclose(grace)

    async def _process(self, stream: Stream) -> None:
        await self.servicer.Process(None, StreamContext(stream))

    async def _access_log(self, stream: Stream) -> None:
        """Envoy's gRPC access log (Envoy's usage meter, filters/usage_log.py): one stream of
        batches per Envoy worker, answered with an empty message when Envoy ends it."""
        assert self.usage_log is not None
        while (message := await stream.read()) is not None:
            self.usage_log.handle(message)
        await stream.write(b"")
