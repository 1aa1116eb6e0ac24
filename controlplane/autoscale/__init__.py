"""The online planner (issue 42): live token demand → desired replicas per pool, and the local
actor that starts and drains emulated replicas on it (``tokenweir up --autoscale``).
"""

from .controller import AUTOSCALE_PATH, Autoscaler, PoolPlan
from .counters import ReplicaCounters, parse_counters
from .demand import Demand, DemandWindow
from .errors import AutoscaleError, ReplicaStartError
from .need import Need, TimeScaled, replicas_for
from .stabilize import Decision, Stabilizer, bounded

__all__ = [
    "AUTOSCALE_PATH",
    "AutoscaleError",
    "Autoscaler",
    "Decision",
    "Demand",
    "DemandWindow",
    "Need",
    "PoolPlan",
    "ReplicaCounters",
    "ReplicaStartError",
    "Stabilizer",
    "TimeScaled",
    "bounded",
    "parse_counters",
    "replicas_for",
]
