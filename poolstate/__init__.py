"""The pool state: saturation of every pool replica, computed from SGLang's ``/metrics``.

Pure parts (parse, saturation, the immutable versioned value and its JSON) and the reader
client services run (:mod:`poolstate.reader`). The control plane scrapes and
publishes (``controlplane/poolwatch``); docs/operations.md, "Saturation signal".
"""

from poolstate.errors import MetricsTextError, PoolStateDecodeError, PoolStateError
from poolstate.metrics_text import ReplicaSample, parse_metrics_text
from poolstate.ranking import Ranking, pool_mismatch, replica_mismatch
from poolstate.saturation import (
    Capacity,
    Hysteresis,
    replica_saturation,
    replica_state,
    summarize_pool,
)
from poolstate.state import SATURATED, PoolState, PoolSummary, ReplicaState

__all__ = [
    "SATURATED",
    "Capacity",
    "Hysteresis",
    "MetricsTextError",
    "PoolState",
    "PoolStateDecodeError",
    "PoolStateError",
    "PoolSummary",
    "Ranking",
    "ReplicaSample",
    "ReplicaState",
    "parse_metrics_text",
    "pool_mismatch",
    "replica_mismatch",
    "replica_saturation",
    "replica_state",
    "summarize_pool",
]
