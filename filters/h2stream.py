"""One ext_proc stream of the HTTP/2 transport (:mod:`filters.h2server`): the subset of a
grpc.aio servicer context that ``FilterServicer.Process`` uses — ``read``, ``write`` and
``invocation_metadata`` — over a call of the shared HTTP/2 layer (:class:`runtime.h2.Stream`)."""

from __future__ import annotations

from typing import NoReturn

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf.message import DecodeError

from runtime.h2 import GrpcError, Status, Stream

__all__ = ["EOF", "StreamContext"]

EOF = grpc.aio.EOF  # type: ignore[attr-defined]  # grpc.aio.EOF exists at run time but not in grpc's stubs


class StreamContext:
    """One ext_proc stream: the grpc.aio-context subset ``FilterServicer.Process`` uses."""

    __slots__ = ("stream",)

    def __init__(self, stream: Stream) -> None:
        self.stream = stream

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.stream.metadata

    async def read(self) -> pb.ProcessingRequest:  # or EOF at the stream's end
        data = await self.stream.read()
        if data is None:
            return EOF
        try:
            return pb.ProcessingRequest.FromString(data)
        except DecodeError as exc:
            raise GrpcError(Status.INTERNAL, "cannot parse ProcessingRequest") from exc

    async def write(self, message: pb.ProcessingResponse) -> None:
        await self.stream.write(message.SerializeToString())

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        """End the call with ``code`` (as grpc.aio's ``context.abort`` does)."""
        try:
            status = Status(code.value[0])
        except ValueError:
            status = Status.INTERNAL
        raise GrpcError(status, details)
