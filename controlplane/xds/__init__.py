"""The xDS side of the control plane: snapshots, their cache, and the ADS server.

Public names: :class:`Snapshot`, :class:`SnapshotCache`, :class:`XdsServer` and the type URLs.
"""

from controlplane.xds.cache import SnapshotCache, by_cluster
from controlplane.xds.errors import InconsistentSnapshotError, XdsError
from controlplane.xds.server import AdsServicer, XdsServer
from controlplane.xds.snapshot import Snapshot, resource_version
from controlplane.xds.types import CLUSTER, ENDPOINT, LISTENER, ORDER, ROUTE

__all__ = [
    "CLUSTER",
    "ENDPOINT",
    "LISTENER",
    "ORDER",
    "ROUTE",
    "AdsServicer",
    "InconsistentSnapshotError",
    "Snapshot",
    "SnapshotCache",
    "XdsError",
    "XdsServer",
    "by_cluster",
    "resource_version",
]
