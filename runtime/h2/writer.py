"""The writing half of :class:`runtime.h2.connection.H2Connection`: frames queued in ``out``
and written with one syscall per loop iteration, DATA sent as the peer's windows and frame
size allow, answers ended with trailers (RST_STREAM(NO_ERROR) when the peer is still sending)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from runtime.h2 import frames as f
from runtime.h2.errors import ErrorCode

if TYPE_CHECKING:
    from runtime.h2.stream import Stream

__all__ = ["Writer"]


class Writer:
    """Mixed into :class:`~runtime.h2.connection.H2Connection`, which owns the state below."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport | None
    out: list[bytes]
    flush_scheduled: bool
    send_window: int
    peer_max_frame: int
    closed: bool
    table_update: bytes
    window_waiters: list[asyncio.Future[None]]
    limits: f.Limits
    resets: float  # the rapid-reset guard's tokens (runtime.h2.control.on_rst_stream)

    def drop(self, s: Stream) -> None:
        raise NotImplementedError

    def host_finish(self, s: Stream, status: int, message: str = "") -> None:
        self.finish(s, f.trailers(status, message))

    async def send(self, s: Stream, data: bytes) -> None:
        """DATA for ``s`` as the peer's windows allow (waits for WINDOW_UPDATE)."""
        if not s.headers_sent:
            self._answering(s)
            self.out.append(f.frame(f.HEADERS, f.END_HEADERS, s.id, self._headers()))
        view, pos, size = memoryview(data), 0, len(data)
        while pos < size:
            if s.closed or self.closed:
                raise ConnectionResetError("the stream was reset")
            n = min(size - pos, self.peer_max_frame, self.send_window, s.send_window)
            if n <= 0:
                self.schedule()
                fut = self.loop.create_future()
                self.window_waiters.append(fut)
                await fut
                continue
            self.send_window -= n
            s.send_window -= n
            self.out.append(f.frame(f.DATA, 0, s.id, bytes(view[pos : pos + n])))
            pos += n
        self.schedule()

    def reply(self, s: Stream, message: bytes) -> bool:
        """A unary answer in one go (headers, message, trailers) when it fits the peer's windows
        and frame size; False (nothing sent) otherwise."""
        n = len(message) + 5
        if s.closed or self.closed:
            return True
        if s.headers_sent or n > self.peer_max_frame or n > self.send_window or n > s.send_window:
            return False
        self.send_window -= n
        self._answering(s)
        self.out.append(f.frame(f.HEADERS, f.END_HEADERS, s.id, self._headers()))
        self.out.append(f.frame(f.DATA, 0, s.id, b"\x00" + (n - 5).to_bytes(4, "big") + message))
        self.finish(s, f.OK_TRAILERS)
        return True

    def finish(self, s: Stream, block: bytes) -> None:
        """Trailers with END_STREAM; RST_STREAM(NO_ERROR) if the peer has not finished."""
        if s.closed or self.closed:
            return
        if not s.headers_sent:
            self._answering(s)
            block = self._headers() + block  # trailers-only
        self.out.append(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, s.id, block))
        if not s.remote_closed:
            self.out.append(f.rst_stream(s.id, ErrorCode.NO_ERROR))
        self.schedule()
        self.drop(s)

    def _answering(self, s: Stream) -> None:
        """The first frame of our answer on ``s``: a reset of it is no longer premature, and
        it earns the rapid-reset guard one token back."""
        s.headers_sent = True
        self.resets = min(float(self.limits.reset_burst), self.resets + 1.0)

    def _headers(self) -> bytes:
        block, self.table_update = self.table_update + f.RESPONSE_HEADERS, b""
        return block

    @staticmethod
    def _window_update(stream: int, n: int) -> bytes:
        return f.frame(f.WINDOW_UPDATE, 0, stream, n.to_bytes(4, "big"))

    def wake_writers(self) -> None:
        waiters, self.window_waiters = self.window_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def schedule(self) -> None:
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        if self.out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self.out))
        self.out.clear()
