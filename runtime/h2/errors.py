"""Errors of the HTTP/2 frame layer (RFC 9113 §5.4, §7) and of the gRPC methods on top of it.

::

    H2Error
    ├── H2ConnectionError   (GOAWAY with a code, then close)
    └── H2StreamError       (RST_STREAM on one stream; the connection lives on)
    GrpcError             (raised by a method: trailers with grpc-status and grpc-message)
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["ErrorCode", "GrpcError", "H2ConnectionError", "H2Error", "H2StreamError", "Status"]


class ErrorCode(IntEnum):
    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


class Status(IntEnum):
    """The gRPC status codes the transports answer with."""

    OK = 0
    CANCELLED = 1
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14


class H2Error(Exception):
    def __init__(self, code: ErrorCode, why: str) -> None:
        super().__init__(f"{code.name}: {why}")
        self.code = code
        self.why = why


class H2ConnectionError(H2Error):
    """A connection error: the connection sends GOAWAY(last stream, code) and closes."""


class H2StreamError(H2Error):
    """A stream error: RST_STREAM(code) on ``stream``; other streams are unaffected."""

    def __init__(self, stream: int, code: ErrorCode, why: str) -> None:
        super().__init__(code, why)
        self.stream = stream


class GrpcError(Exception):
    """Raised by a method (or the transport) to end a call with a non-OK grpc-status."""

    def __init__(self, status: Status, message: str = "") -> None:
        super().__init__(f"{status.name}: {message}")
        self.status = status
        self.message = message
