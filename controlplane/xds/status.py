"""What one ADS stream's Envoy holds, as plain data for status pages (the dashboard).

Per resource type: the version Envoy last accepted (ACK), the one in flight (sent, not yet
answered), and the last rejection (NACK: the version, Envoy's error, and whether the node is
still refusing the config it is meant to hold).
"""

from __future__ import annotations

from typing import TypedDict

from google.protobuf.message import Message

from controlplane.xds.session import Session
from controlplane.xds.types import ORDER, short_name

__all__ = ["ADMIN_METADATA", "NackStatus", "NodeStatus", "TypeStatus", "node_status"]

# node metadata an Envoy started by ``tokenweir up`` carries: its admin address (the dashboard
# reads its stats there; tokenweir.envoy_launcher sets it)
ADMIN_METADATA = "tokenweir_admin"


class NackStatus(TypedDict):
    """The last rejection of a type: the version, Envoy's error (cut at 500 characters), how
    long ago, and whether the node still refuses the content it is meant to hold."""

    version: str
    error: str
    age_s: float
    current: bool


class TypeStatus(TypedDict):
    acked_version: str | None
    pending_version: str | None
    resources: int
    nack: NackStatus | None


class NodeStatus(TypedDict):
    node: str
    admin: str | None  # the Envoy's admin address, from its node metadata
    group: str
    mode: str
    target_version: str | None
    types: dict[str, TypeStatus]  # short type name (``Cluster``, …) → what the node holds


def node_status(session: Session[Message], now: float) -> NodeStatus:
    types: dict[str, TypeStatus] = {}
    for type_url in ORDER:
        state = session.types[type_url]
        if not state.asked:
            continue
        nack = state.last_nack
        types[short_name(type_url)] = {
            "acked_version": state.accepted_version or None,
            "pending_version": state.pending.version if state.pending is not None else None,
            "resources": len(state.held),
            "nack": None
            if nack is None
            else {
                "version": nack[0],
                "error": nack[1][:500],
                "age_s": round(max(0.0, now - nack[2]), 1),
                "current": state.rejected_key is not None,
            },
        }
    admin = session.node.metadata.fields.get(ADMIN_METADATA)
    return {
        "node": session.node.id,
        "admin": admin.string_value or None if admin is not None else None,
        "group": session.group,
        "mode": session.mode,
        "target_version": session.target.version if session.target is not None else None,
        "types": types,
    }
