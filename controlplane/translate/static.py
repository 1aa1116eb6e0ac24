"""Fold one node group's dynamic resources into a static Envoy bootstrap (pure).

Used to check rendered resources with ``envoy --mode validate`` and by ``tokenweir render
--static`` for people who want to run one Envoy without the control plane.
"""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from google.protobuf.json_format import MessageToDict

from controlplane.translate.protos import any_of
from controlplane.translate.render import CLUSTER, ENDPOINT, LISTENER, ROUTE, Resources
from wire.jsontypes import JsonArray, JsonObject

__all__ = ["static_bootstrap"]

_HCM_NAME = "envoy.filters.network.http_connection_manager"


def static_bootstrap(
    res: Resources, *, node_id: str = "validate", admin_port: int = 0
) -> JsonObject:
    clusters: JsonArray = []
    for name, c in sorted(res[CLUSTER].items()):
        cluster = cluster_pb2.Cluster()
        cluster.CopyFrom(c)
        if cluster.type == cluster_pb2.Cluster.EDS:
            cluster.ClearField("eds_cluster_config")
            cluster.type = cluster_pb2.Cluster.STATIC
            cla = res[ENDPOINT].get(name)
            if cla is not None:
                cluster.load_assignment.CopyFrom(cla)
        clusters.append(MessageToDict(cluster))
    listeners: JsonArray = []
    for _, lst in sorted(res[LISTENER].items()):
        listener = listener_pb2.Listener()
        listener.CopyFrom(lst)
        for chain in listener.filter_chains:
            for f in chain.filters:
                if f.name != _HCM_NAME:
                    continue
                hcm = hcm_pb2.HttpConnectionManager()
                f.typed_config.Unpack(hcm)
                if hcm.HasField("rds"):
                    rc = res[ROUTE][hcm.rds.route_config_name]
                    hcm.ClearField("rds")
                    hcm.route_config.CopyFrom(rc)
                f.typed_config.CopyFrom(any_of(hcm))
        listeners.append(MessageToDict(listener))
    return {
        "node": {"id": node_id, "cluster": node_id},
        "admin": {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}
        },
        "static_resources": {"clusters": clusters, "listeners": listeners},
    }
