"""A fake ADS client: drives ``AdsServicer`` stream methods with no socket and no gRPC server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf.message import Message
from google.rpc import status_pb2

__all__ = ["FakeStream", "ManualClock", "delta_request", "node", "sotw_request"]


class ManualClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def node(node_id: str = "envoy-1", cluster: str = "edge") -> base_pb2.Node:
    return base_pb2.Node(id=node_id, cluster=cluster)


def sotw_request(
    type_url: str,
    names: list[str] | None = None,
    *,
    nonce: str = "",
    version: str = "",
    error: str | None = None,
    who: base_pb2.Node | None = None,
) -> discovery_pb2.DiscoveryRequest:
    request = discovery_pb2.DiscoveryRequest(
        type_url=type_url,
        resource_names=names or [],
        response_nonce=nonce,
        version_info=version,
    )
    if who is not None:
        request.node.CopyFrom(who)
    if error is not None:
        request.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
    return request


def delta_request(
    type_url: str,
    subscribe: list[str] | None = None,
    *,
    unsubscribe: list[str] | None = None,
    nonce: str = "",
    error: str | None = None,
    initial: dict[str, str] | None = None,
    who: base_pb2.Node | None = None,
) -> discovery_pb2.DeltaDiscoveryRequest:
    request = discovery_pb2.DeltaDiscoveryRequest(
        type_url=type_url,
        resource_names_subscribe=subscribe or [],
        resource_names_unsubscribe=unsubscribe or [],
        response_nonce=nonce,
        initial_resource_versions=initial or {},
    )
    if who is not None:
        request.node.CopyFrom(who)
    if error is not None:
        request.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
    return request


class FakeStream:
    """One bidirectional stream: ``send`` requests, ``recv`` responses, ``silent`` asserts none."""

    def __init__(self, method: Callable[[AsyncIterator[Any], Any], AsyncIterator[Any]]) -> None:
        self._requests: asyncio.Queue[Message | None] = asyncio.Queue()
        self._responses: asyncio.Queue[Any] = asyncio.Queue()
        self._task = asyncio.create_task(self._drain(method(self._iterate(), None)))

    async def _iterate(self) -> AsyncIterator[Message]:
        while (item := await self._requests.get()) is not None:
            yield item

    async def _drain(self, responses: AsyncIterator[Any]) -> None:
        async for response in responses:
            self._responses.put_nowait(response)

    def send(self, request: Message) -> None:
        self._requests.put_nowait(request)

    async def recv(self, timeout: float = 2.0) -> Any:
        return await asyncio.wait_for(self._responses.get(), timeout)

    async def silent(self, seconds: float = 0.05) -> None:
        """Fail if a response arrives within ``seconds``."""
        await asyncio.sleep(seconds)
        assert self._responses.empty(), f"unexpected response: {self._responses.get_nowait()}"

    async def close(self) -> None:
        self._requests.put_nowait(None)
        await asyncio.wait_for(self._task, 2.0)
