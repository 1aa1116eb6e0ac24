"""Policy of the online planner: per pool, how many replicas the live token demand needs and how
fast that number may move (docs/capacity.md "Autoscaling from token demand").

The control plane runs the capacity planner (controlplane/planner) on live inputs each
``interval`` and publishes ``tokenweir_pool_desired_replicas{pool,reason}``; ``tokenweir up
--autoscale`` (emulated pools) or a Kubernetes HPA / KEDA ScaledObject acts on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from policy.common import Positive
from policy.decode import Duration, Range

__all__ = ["AutoscalePolicy", "autoscale_issues", "emulated_slots"]


@dataclass(frozen=True)
class AutoscalePolicy:
    """Bounds, headroom, forecast and damping of one pool's replica count.

    - ``min_replicas``/``max_replicas``: the count never leaves these bounds.
    - ``gpus_per_replica``/``gpu_budget``: at most ``gpu_budget // gpus_per_replica`` replicas
      (no budget: ``max_replicas`` alone).
    - ``headroom``: plan for ``(1 + headroom)`` times the forecast demand (the seed's 20–40%).
    - ``tbt_budget``: time between tokens each stream must get; the TTFT budget is the
      interactive lane's ``admission.lanes.interactive.ttft_budget``.
    - ``window``: the demand (arrival rate, token means, cache hit ratio) is measured over it.
    - ``forecast``: how far ahead the trend of the arrival rate is projected (at least a
      replica's ``load_time``: a ramp is met by replicas that are ready when it arrives).
    - ``scale_up_cooldown``/``scale_down_cooldown``: least time between two changes of the count
      in that direction; ``scale_down_window``: a lower count is taken only when every need
      computed over that window was that low (hysteresis).
    - ``profile``: the replica's backend profile (backends/profiles) when the pool is not
      emulated; an emulated pool uses its own. ``time_scale`` likewise (1 for real GPUs).
    - ``load_time``: emulated replicas answer 503 that long after their start (model load);
      ``drain_timeout``: longest a replica leaving the pool may take to finish its streams.
    """

    min_replicas: Annotated[int, Range(0, 10_000)] = 1
    max_replicas: Annotated[int, Range(1, 10_000)] = 8
    gpus_per_replica: Positive = 1
    gpu_budget: Positive | None = None
    headroom: Annotated[float, Range(0.0, 4.0)] = 0.3
    tbt_budget: Annotated[float, Duration(0.0001, 60)] = 0.1
    interval: Annotated[float, Duration(0.05, 600)] = 1.0
    window: Annotated[float, Duration(0.5, 3600)] = 20.0
    forecast: Annotated[float, Duration(0, 3600)] = 30.0
    scale_up_cooldown: Annotated[float, Duration(0, 3600)] = 5.0
    scale_down_cooldown: Annotated[float, Duration(0, 3600)] = 60.0
    scale_down_window: Annotated[float, Duration(0, 3600)] = 60.0
    profile: str | None = None
    time_scale: Annotated[float, Range(0.001, 1000)] | None = None
    load_time: Annotated[float, Duration(0, 3600)] = 20.0
    drain_timeout: Annotated[float, Duration(0.1, 86400)] = 300.0

    def __post_init__(self) -> None:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) must not exceed max_replicas "
                f"({self.max_replicas})"
            )
        if self.gpu_budget is not None and self.gpu_budget < self.gpus_per_replica:
            raise ValueError(
                f"gpu_budget ({self.gpu_budget}) is below one replica's gpus_per_replica "
                f"({self.gpus_per_replica}): no replica fits"
            )
        if self.window <= self.interval:
            raise ValueError("window must be longer than interval (a rate needs two samples)")

    @property
    def budget_replicas(self) -> int | None:
        """Most replicas the GPU budget pays for (None: no budget)."""
        if self.gpu_budget is None:
            return None
        return self.gpu_budget // self.gpus_per_replica


def emulated_slots(replicas: int, autoscale: AutoscalePolicy | None) -> int:
    """Ports an emulated pool claims from ``base_port``: its replicas, or with autoscaling as
    many as ``max_replicas`` allows (``up --autoscale`` starts replicas on the free ones)."""
    return replicas if autoscale is None else max(replicas, autoscale.max_replicas)


def autoscale_issues(
    path: str, autoscale: AutoscalePolicy, *, emulated: bool, endpoints_file: str | None
) -> list[tuple[str, str]]:
    """(key path, problem) of one pool's ``autoscale`` section against the rest of the pool (the
    profile's name is checked where the profiles live: tokenweir/check.py)."""
    out = []
    if autoscale.profile is None and not emulated:
        out.append(
            (
                f"{path}.autoscale.profile",
                "required for a pool that is not emulated: the planner needs the replica's "
                "capacity (a backend profile name, see `tokenweir plan --help`)",
            )
        )
    if emulated and endpoints_file is None:
        out.append(
            (
                f"{path}.endpoints_file",
                "required with autoscale on an emulated pool: `tokenweir up` writes the "
                "replicas that serve there (a file next to the policy, e.g. chat.endpoints)",
            )
        )
    return out
