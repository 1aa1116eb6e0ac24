"""``grpc.health.v1.Health`` on a grpc.aio server, answered from a :class:`HealthState`.

The servicer is grpcio-health-checking's own aio implementation (Check and Watch); this binds it
to the process's :class:`~runtime.health.HealthState`. :meth:`AioHealth.sync` pushes the state
into it (Watch streams see the change); a drain calls it right after ``HealthState.shutdown``.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import _async as health_aio  # the aio servicer (public as health.aio)
from grpc_health.v1 import health_pb2_grpc

from runtime.health import HealthState

__all__ = ["AioHealth"]


class AioHealth:
    def __init__(self, state: HealthState) -> None:
        self.state = state
        self.servicer = health_aio.HealthServicer()

    def add_to(self, server: grpc.aio.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    async def sync(self) -> None:
        """Make the servicer answer what the state says (once NOT_SERVING, it stays so)."""
        if not self.state.serving:
            await self.servicer.enter_graceful_shutdown()
            return
        for name, status in self.state.statuses().items():
            await self.servicer.set(name, status)
