"""The online planner (issue 42): live token demand → desired replicas per pool, and the local
actor that starts and drains emulated replicas on it (``tokenweir up --autoscale``).

Modules: ``counters`` (what a replica's page says), ``demand`` (arrivals and token means over a
window), ``rates`` (each replica's measured decode and prefill speed), ``lanes`` (arrivals by
lane, each lane's wait count), ``need`` (the planner's count), ``stabilize`` (bounds, budget,
damping), ``controller`` (the loop, metrics and API).
"""

from poolstate.counters import ReplicaCounters, parse_counters

from .controller import AUTOSCALE_PATH, Autoscaler, PoolPlan
from .demand import Demand, DemandWindow
from .errors import AutoscaleError, ReplicaStartError
from .lanes import LaneDemand, LaneWindow
from .need import Need, TimeScaled, replicas_for
from .rates import RateEstimator, Speed
from .stabilize import Decision, Stabilizer, bounded

__all__ = [
    "AUTOSCALE_PATH",
    "AutoscaleError",
    "Autoscaler",
    "Decision",
    "Demand",
    "DemandWindow",
    "LaneDemand",
    "LaneWindow",
    "Need",
    "PoolPlan",
    "RateEstimator",
    "ReplicaCounters",
    "ReplicaStartError",
    "Speed",
    "Stabilizer",
    "TimeScaled",
    "bounded",
    "parse_counters",
    "replicas_for",
]
