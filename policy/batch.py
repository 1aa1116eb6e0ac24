"""Policy of the batch API and its runner (batch_service/; docs/batch.md).

The API (OpenAI's ``/v1/files`` and ``/v1/batches``) is an HTTP service of the policy: the
gateway routes those paths to it like any service, behind the ``identity`` plugin (the same
tenant keys as chat traffic). ``batch.service`` names that service; ``tokenweir up`` starts one
API server on each of its endpoints. Runners (``runner.replicas``) feed the jobs' lines into
``pool`` through ``gateway``, in the batch lane, while the pool has headroom.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from policy.common import Port
from policy.decode import Duration, Range, Size

__all__ = [
    "BATCH_LINE_HEADER",
    "BatchLimits",
    "BatchPolicy",
    "BatchRunner",
]

# set by the runner on every line: the gateway's batch route matches it (lane batch, idempotency)
BATCH_LINE_HEADER = "x-batch-line"


@dataclass(frozen=True)
class BatchLimits:
    """Per tenant: files kept, their bytes together, and jobs not yet finished."""

    files: Annotated[int, Range(1, 1_000_000)] = 100
    bytes: Annotated[int, Size(1024, 1024**4)] = 1024**3
    jobs_in_flight: Annotated[int, Range(1, 10_000)] = 10


@dataclass(frozen=True)
class BatchRunner:
    """The runner processes: ``replicas`` of them (0: none, the API only); replica ``i`` serves
    /metrics on ``metrics_port + i``. Each keeps at most ``max_concurrency`` lines in flight and
    fills up to ``fill`` of the running slots interactive requests leave idle, less their
    recent rise (batch_service/pacer.py); a line the gateway sheds (429, 503) halves the window and pauses the
    runner for ``backoff``. ``line_retries``: how often a line answered 5xx is sent again
    before it is recorded as failed; the runner pauses ``backoff``, then twice that, and so on
    (8: about 4 minutes with 1 s, longer than a restart of any part of the mesh).
    ``max_step_increase``: while interactive requests are active, the batch may lengthen each
    replica's decode step (the interactive streams' time between tokens) by at most this share
    of the step they would see alone, measured on the replica (batch_service/stepguard.py;
    0.1: 10%); ``null`` turns the step guard off (only the slots bound the batch)."""

    replicas: Annotated[int, Range(0, 16)] = 1
    metrics_port: Port = 18075
    max_concurrency: Annotated[int, Range(1, 4096)] = 128
    fill: Annotated[float, Range(0.05, 1.0)] = 0.95
    backoff: Annotated[float, Duration(0.01, 600)] = 1.0
    line_retries: Annotated[int, Range(0, 30)] = 8
    claim_idle: Annotated[float, Duration(1, 3600)] = 15.0  # a dead runner's job is taken after
    max_step_increase: Annotated[float, Range(0.0, 100.0)] | None = 0.1


@dataclass(frozen=True)
class BatchPolicy:
    """``completion_window``: how long the one window OpenAI offers (``24h``) lasts here (a
    shorter one for tests and time-scaled benchmarks). ``files_dir``: the file store (a
    directory; relative to the policy file; unset: ``batch-files`` in ``up``'s state folder).
    ``price_factor``: the share of ``prices.<model>`` a request in the batch lane pays (its
    ``usd`` quotas, reservations, settlement and spend metrics; 0.5: OpenAI's Batch discount;
    at most 1: the batch lane is never dearer than interactive)."""

    service: str
    gateway: str
    pool: str
    files_dir: str | None = None
    max_file_bytes: Annotated[int, Size(1024, 1024**4)] = 200 * 1024**2
    max_lines: Annotated[int, Range(1, 10_000_000)] = 50_000
    completion_window: Annotated[float, Duration(1, 30 * 86400)] = 86400.0
    price_factor: Annotated[float, Range(0.0, 1.0)] = 1.0
    limits: BatchLimits = field(default_factory=BatchLimits)
    runner: BatchRunner = field(default_factory=BatchRunner)
