"""Capacity planner (``tokenweir plan``): from QPS and latency budgets to replicas, queue bounds,
token-bucket parameters and a policy fragment, each number with the formula that produced it.
"""

from .capacity import MODELS, Capacity, Model, Step, WaitEstimate
from .errors import InfeasibleError, PlanInputError, PlannerError
from .inputs import PlanInputs, TenantClass, TokenDist, TrafficClass
from .plan import Plan, make_plan
from .replica import FlatReplica, ReplicaModel, for_workload, profile_replica

__all__ = [
    "MODELS",
    "Capacity",
    "FlatReplica",
    "InfeasibleError",
    "Model",
    "Plan",
    "PlanInputError",
    "PlanInputs",
    "PlannerError",
    "ReplicaModel",
    "Step",
    "TenantClass",
    "TokenDist",
    "TrafficClass",
    "WaitEstimate",
    "for_workload",
    "make_plan",
    "profile_replica",
]
