"""The HTTP/2 frame layer and gRPC server shared by the built-in transports (the filter
server's ext_proc stream and the rate-limit service's ShouldRateLimit); no service owns it.

Why our own and not the ``h2`` / ``hyperframe`` libraries: see ``docs/benchmarks.md``
("HTTP/2 frame layer"). Limits and behaviour follow grpcio and nghttp2; the adversarial tests
in ``tests/runtime/h2`` hold it to them.
"""

from runtime.h2.errors import (
    ErrorCode,
    GrpcError,
    H2ConnectionError,
    H2Error,
    H2StreamError,
    Status,
)
from runtime.h2.frames import Limits
from runtime.h2.server import GrpcH2Server, Method, is_loopback, transport_for
from runtime.h2.stream import Stream

__all__ = [
    "ErrorCode",
    "GrpcError",
    "GrpcH2Server",
    "H2ConnectionError",
    "H2Error",
    "H2StreamError",
    "Limits",
    "Method",
    "Status",
    "Stream",
    "is_loopback",
    "transport_for",
]
