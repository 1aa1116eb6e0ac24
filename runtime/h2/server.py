"""A gRPC server on :mod:`runtime.h2.connection` for the methods a service hands it.

Each call is routed by ``:path`` (an unknown method is answered UNIMPLEMENTED, grpc-status 12),
its ``grpc-timeout`` is honoured (DEADLINE_EXCEEDED, the method is cancelled), and
``/grpc.health.v1.Health/Check`` is answered from a :class:`runtime.health.HealthState`.
A unary method is started once its request has fully arrived; a streaming method at once.
``aclose(grace)`` stops accepting, sends GOAWAY with the last stream processed, lets calls in
flight finish for up to ``grace`` seconds, then closes.

Only loopback addresses are served: anything reachable from another host (or needing TLS)
belongs on grpc.aio (``docs/operations.md``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Callable, Mapping
from ssl import SSLContext

from google.protobuf.message import DecodeError

from runtime.h2 import frames as f
from runtime.h2.connection import H2Connection
from runtime.h2.errors import GrpcError, Status
from runtime.h2.stream import Method, Stream
from runtime.health import CHECK_PATH, HealthState, UnknownService

__all__ = ["GrpcH2Server", "Method", "is_loopback", "transport_for"]

log = logging.getLogger(__name__)


def transport_for(requested: str, host: str, tls: bool = False) -> str:
    """The transport a service serves on ``host``: the built-in ``h2`` on loopback or behind
    TLS (mTLS: only Envoy's certificate gets a connection), else ``grpc`` (grpc.aio; logged), so
    no service exposes the built-in transport to the network in clear."""
    if requested == "h2" and not tls and not is_loopback(host):
        log.warning(
            "%s is not a loopback address: serving with grpc.aio, not the built-in h2", host
        )
        return "grpc"
    return requested


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class GrpcH2Server:
    """``port = await start(host, port)`` … ``await aclose(grace)``."""

    def __init__(
        self,
        methods: Mapping[str, Method],
        *,
        health: HealthState | None = None,
        limits: f.Limits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.health = health if health is not None else HealthState()
        self.methods = {**methods, CHECK_PATH: Method(unary=self._check)}
        self.limits = limits or f.Limits()
        self.clock = clock
        self.conns: set[H2Connection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.loop = asyncio.get_event_loop()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(
        self,
        host: str,
        port: int,
        ssl: SSLContext | None = None,
        before_handshake: Callable[[], object] | None = None,
    ) -> int:
        """``ssl``: serve TLS (runtime.tls_server); without it, loopback only.
        ``before_handshake``: called as each connection is accepted, before its TLS handshake
        (runtime.tls_server.RenewingTls.refresh loads a renewed certificate there)."""
        if ssl is None and not is_loopback(host):
            raise ValueError(
                f"the built-in HTTP/2 transport serves loopback only without TLS, not {host!r}: "
                "configure TLS, or use --transport grpc (grpc.aio) for other addresses"
            )
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(
            self._connection if before_handshake is None else self._hooked(before_handshake),
            host.strip("[]"), port, reuse_port=True, ssl=ssl,
        )  # fmt: skip
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    def _connection(self) -> H2Connection:
        return H2Connection(self)

    def _hooked(self, hook: Callable[[], object]) -> Callable[[], H2Connection]:
        def connection() -> H2Connection:
            hook()
            return H2Connection(self)

        return connection

    async def aclose(self, grace: float = 1.0) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.conns):
            conn.drain()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=grace)
        for conn in list(self.conns):
            conn._flush()
            conn.close()
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=1.0)
        if self._server is not None:
            await self._server.wait_closed()

    # -- calls (the connection's host interface) --------------------------------------------
    def open(self, conn: H2Connection, s: Stream) -> None:
        method = self.methods.get(s.path)
        if method is None:
            return conn.finish(s, f.trailers(Status.UNIMPLEMENTED, f"unknown method {s.path}"))
        if s.timeout is not None:
            s.timer = self.loop.call_later(s.timeout, self._expire, conn, s)
        s.method = method
        if method.streaming is not None or s.remote_closed:
            self.ready(conn, s)

    def ready(self, conn: H2Connection, s: Stream) -> None:
        method, s.method = s.method, None  # started: END_STREAM does not start it again
        assert method is not None  # open() set it; the connection calls this only then
        task: asyncio.Task[None] = self.loop.create_task(self._call(conn, s, method))
        s.task = task
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    @staticmethod
    async def _call(conn: H2Connection, s: Stream, method: Method) -> None:
        """Run the method; end the call with its grpc-status (13 for an unexpected error)."""
        try:
            if method.streaming is not None:
                await method.streaming(s)
            else:
                if len(s.inbox) != 1:
                    n = len(s.inbox)
                    raise GrpcError(Status.INTERNAL, f"expected one request message, got {n}")
                if method.unary_metadata is not None:
                    reply = await method.unary_metadata(s.take(), s.metadata)
                else:
                    assert method.unary is not None
                    reply = await method.unary(s.take())
                s.task = None  # ending the stream below must not cancel this very task
                if conn.reply(s, reply):  # the common case: headers, message, trailers at once
                    return
                await s.write(reply)
            block = f.OK_TRAILERS
        except GrpcError as exc:
            block = f.trailers(exc.status, exc.message)
        except Exception:  # the method's bug: answered INTERNAL, logged once per call
            if s.closed or conn.closed:
                return  # reset by the peer or closing: nobody to answer
            log.exception("gRPC method %s failed", s.path)
            block = f.trailers(Status.INTERNAL, "internal error")
        s.task = None
        conn.finish(s, block)

    def _expire(self, conn: H2Connection, s: Stream) -> None:
        s.timer = None
        conn.finish(s, f.trailers(Status.DEADLINE_EXCEEDED, "deadline exceeded"))

    async def _check(self, request: bytes) -> bytes:
        try:
            return self.health.check_bytes(request)
        except UnknownService as exc:
            raise GrpcError(Status.NOT_FOUND, f"unknown service {exc}") from exc
        except DecodeError as exc:
            raise GrpcError(Status.INVALID_ARGUMENT, "bad HealthCheckRequest") from exc
