"""The port plan: every port a policy makes the mesh listen on, and the one check against clashes.

One allocator for every port that comes from the policy: its addresses and their defaults, the
replicas (``replicas:`` in the file, or ``tokenweir up --replicas``, applied to the policy before
the plan is made), each server's per-process /metrics ports and the emulators' KV-event ports.
Replica ``i`` of a server listens on the configured port ``+ i`` (:func:`replica_addresses`),
its worker ``w``'s /metrics on ``metrics_port + i * workers + w`` (:func:`worker_metrics_ports`).

:func:`port_plan` lists each port with its user (which part, which replica, which key placed it);
:func:`port_clashes` finds a port claimed twice (or past 65535) and says how to fix it: the first
value of either key whose whole block of ports is free. The loader runs it (``tokenweir
validate``, every reload) and ``tokenweir up`` runs it on the policy with ``--replicas`` applied,
before anything starts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from policy.autoscale import emulated_slots
from policy.model import Address, Policy
from policy.servers import replica_addresses, worker_metrics_ports

__all__ = ["PortClaim", "PortClash", "port_clashes", "port_plan"]

_LAST = 65535


@dataclass(frozen=True)
class PortClaim:
    """One port of the plan: ``part`` (``ratelimit``, ``gateway edge``), its ``replica`` (None
    when the part is not replicated), ``what`` it serves there, and the policy ``key`` whose value
    placed it (``origin`` is what that value is added to: 0 for a port or address, the replica's
    port for an offset; ``host`` is set when the value is ``host:port``)."""

    port: int
    key: str
    part: str
    replica: int | None
    what: str
    host: str | None = None
    origin: int = 0

    @property
    def user(self) -> str:
        name = self.part if self.replica is None else f"{self.part}#{self.replica}"
        return f"{name} ({self.what}, {self.key})"

    def value(self, port: int) -> str:
        """How ``key`` is written to put this claim on ``port``."""
        v = port - self.origin
        return f"{self.host}:{v}" if self.host is not None else str(v)


@dataclass(frozen=True)
class PortClash:
    key: str  # where the loader reports it: the later claim's key
    message: str


def port_plan(policy: Policy) -> tuple[PortClaim, ...]:
    """Every port the mesh of ``policy`` listens on, in the order ``up`` starts the parts
    (``policy.replicas`` already holds any ``--replicas`` override)."""
    n = policy.replicas
    out: list[PortClaim] = []
    cp = policy.control_plane
    out += _servers(cp.xds, n.controlplane, "control_plane.xds", "control plane", "xDS")
    out += _servers(cp.metrics, n.controlplane, "control_plane.metrics", "control plane", "metrics")
    if policy.ratelimit is not None:
        rl = policy.ratelimit
        out += _servers(rl.address, n.ratelimit, "ratelimit.address", "ratelimit", "gRPC")
        out += _metrics(rl.metrics_port, n.ratelimit, rl.replicas, "ratelimit")
    if policy.filters is not None:
        fs = policy.filters
        out += _servers(fs.address, n.filters, "filters.address", "filters", "gRPC")
        out += _metrics(fs.metrics_port, n.filters, fs.processes, "filters")
    for name, gw in policy.gateways.items():  # every gateway replica shares it (SO_REUSEPORT)
        out.append(_one(gw.listen, f"gateways.{name}.listen", f"gateway {name}", "listener"))
    for name, sc in policy.sidecars.items():
        for side, sd in (("inbound", sc.inbound), ("outbound", sc.outbound)):
            if sd is not None:
                key = f"sidecars.{name}.{side}.listen"
                out.append(_one(sd.listen, key, f"sidecar {name}", f"{side} listener"))
    for name in policy.pools:
        out += _emulators(policy, name)
    b = policy.batch
    if b is not None and b.service in policy.services:  # `up` starts the API and its runners
        for i, a in enumerate(policy.services[b.service].endpoints):
            out.append(
                PortClaim(
                    a.port, f"services.{b.service}.endpoints", "batch API", i, "HTTP", host=a.host
                )
            )
        if b.runner.replicas:
            out += _metrics(b.runner.metrics_port, b.runner.replicas, 1, "batch.runner")
    return tuple(out)


def port_clashes(plan: Iterable[PortClaim]) -> list[PortClash]:
    """Each port claimed twice, or past 65535, with both users and the fix."""
    claims = list(plan)
    used: dict[int, PortClaim] = {}
    clashes: list[PortClash] = []
    for c in claims:
        if c.port > _LAST:
            clashes.append(
                PortClash(
                    c.key,
                    f"port {c.port} of {c.user} is past {_LAST}: "
                    f"lower {c.key} or run fewer {c.part} replicas",
                )
            )
            continue
        first = used.get(c.port)
        if first is None:
            used[c.port] = c
            continue
        fixes = [f"set {c.key} to {_free_value(claims, c)}"]
        if first.key != c.key:
            fixes.append(f"{first.key} to {_free_value(claims, first)}")
        fewer = sorted({x.part for x in (first, c) if x.replica})
        if fewer:
            fixes.append("run fewer " + " or ".join(f"{p} replicas" for p in fewer))
        clashes.append(
            PortClash(
                c.key,
                f"port {c.port} is claimed twice: by {first.user} and by {c.user}; "
                f"fix: {', or '.join(fixes)}",
            )
        )
    return clashes


def _free_value(claims: list[PortClaim], moved: PortClaim) -> str:
    """The value of ``moved.key`` (searching up from its own) whose ports clash with nothing."""
    own = [c for c in claims if c.key == moved.key]
    others = {c.port for c in claims if c.key != moved.key}
    anchor = min(own, key=lambda c: c.port)
    offsets = [c.port - anchor.port for c in own]
    for base in range(anchor.port + 1, _LAST - max(offsets) + 1):
        if not any(base + d in others for d in offsets):
            return anchor.value(base)
    return "a lower value"


def _one(addr: Address, key: str, part: str, what: str) -> PortClaim:
    return PortClaim(addr.port, key, part, None, what, host=addr.host)


def _servers(first: Address, count: int, key: str, part: str, what: str) -> list[PortClaim]:
    if count == 1:
        return [_one(first, key, part, what)]
    return [
        PortClaim(a.port, key, part, i, what, host=first.host, origin=i)
        for i, a in enumerate(replica_addresses(first, count))
    ]


def _metrics(first: int | None, replicas: int, workers: int, part: str) -> list[PortClaim]:
    if first is None:
        return []
    key = f"{part}.metrics_port"
    return [
        PortClaim(
            port,
            key,
            part,
            r if replicas > 1 else None,
            f"metrics of process {w}",
            origin=port - first,
        )
        for r, w, port in worker_metrics_ports(first, replicas, workers)
    ]


def _emulators(policy: Policy, name: str) -> list[PortClaim]:
    pool = policy.pools[name]
    em = pool.emulated
    if em is None or em.base_port is None:
        return []
    part, key = f"emulator {name}", f"pools.{name}.emulated.base_port"
    slots = emulated_slots(em.replicas, pool.autoscale)  # autoscaled: up to max_replicas
    out = [PortClaim(em.base_port + i, key, part, i, "HTTP", origin=i) for i in range(slots)]
    if pool.routing.mode == "prefix_index":  # `up` binds each replica's KV-event ports
        r, at = pool.routing, f"pools.{name}.routing"
        for i in range(slots):
            port = em.base_port + i
            for k, off, what in (
                ("kv_events_port_offset", r.kv_events_port_offset, "KV events"),
                ("kv_events_replay_offset", r.replay_offset, "KV-event replay"),
            ):
                out.append(PortClaim(port + off, f"{at}.{k}", part, i, what, origin=port))
    return out
