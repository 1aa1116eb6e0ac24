"""Small pieces of ``tokenweir up`` (:mod:`tokenweir.up`) that need no ``Mesh``: the
emulator's KV-event flags, waiting for an Envoy's listener, cancellable waits while stopping, and
the per-Envoy base id and connection cap."""

from __future__ import annotations

import asyncio
import json
import logging
import zlib
from collections.abc import Awaitable
from pathlib import Path

from policy import Address, Policy
from policy.routing import EMULATOR_TOKENIZER, RoutingPolicy
from runtime.children import ChildError
from runtime.errors import PortTimeout
from runtime.ports import wait_port
from tokenweir.envoy_launcher import EnvoyProcess

__all__ = ["base_id", "connection_cap", "kv_event_args", "unless", "wait_listening"]

log = logging.getLogger("tokenweir.up")


def kv_event_args(routing: RoutingPolicy, addr: Address) -> list[str]:
    """Emulator flags publishing KV events where the picker looks for them (prefix_index), and
    tokenizing with the model the picker renders for (``routing.tokenizer``)."""
    if routing.mode != "prefix_index":
        return []
    port = addr.port + routing.kv_events_port_offset
    cfg = {
        "publisher": "zmq",
        # SGLang's rule: a PUB endpoint is bound only with a wildcard (else it connects)
        "endpoint": f"tcp://*:{port}",
        "replay_endpoint": f"tcp://{addr.host}:{addr.port + routing.replay_offset}",
    }
    args = ["--kv-events-config", json.dumps(cfg), "--page-size", str(routing.page_size)]
    if routing.tokenizer != EMULATOR_TOKENIZER:
        args += ["--tokenizer-path", routing.tokenizer]
    return args


async def wait_listening(addr: Address, envoy: EnvoyProcess, timeout: float = 20.0) -> None:
    try:
        await wait_port(addr.host, addr.port, timeout=timeout, alive=envoy.alive)
    except PortTimeout:
        raise ChildError(
            f"envoy did not open {addr} within {timeout}s:\n{envoy.log_tail()}"
        ) from None
    except ChildError:
        raise ChildError(f"envoy exited:\n{envoy.log_tail()}") from None


async def unless(force: asyncio.Event | None, work: Awaitable[object]) -> None:
    """Await ``work`` unless ``force`` gets set first (then ``work`` is cancelled)."""
    task = asyncio.ensure_future(work)
    if force is None:
        await task
        return
    stop = asyncio.create_task(force.wait())
    await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    for t in (task, stop):
        t.cancel()
    for outcome in await asyncio.gather(task, stop, return_exceptions=True):
        if isinstance(outcome, Exception):
            log.error("while stopping: %s: %s", type(outcome).__name__, str(outcome)[:300])


def base_id(run_dir: Path, node: str) -> int:
    """Distinct per node and per run folder, so several meshes and tests can share a machine."""
    return 1000 + zlib.crc32(f"{run_dir}:{node}".encode()) % 60000


def connection_cap(policy: Policy, node: str) -> int:
    """The process-wide client connection cap of one Envoy: what its listeners allow together."""
    gw = policy.gateways.get(node)
    if gw is not None:
        return gw.downstream.max_connections
    sc = policy.sidecars[node]
    listeners = (sc.inbound is not None) + (sc.outbound is not None)
    return sc.downstream.max_connections * max(1, listeners)
