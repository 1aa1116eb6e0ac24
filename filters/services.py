"""What plugins get at construction: the policy and the shared, long-lived helpers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from filters.budget import Budget, NoBudget
from filters.estimate import ByteBound, Estimator
from filters.keys import KeyStore, policy_keys
from filters.metrics import FilterMetrics
from filters.output_lengths import OutputLengths

__all__ = ["Services", "default_services"]


@dataclass(frozen=True)
class Services:
    """Shared by every plugin of a server; ``policy`` is the one the chains were built from."""

    policy: Any  # policy.Policy
    keys: KeyStore
    budget: Budget
    estimator: Estimator
    metrics: FilterMetrics
    clock: Callable[[], float]
    gates: Any = None  # filters.plugins.admission.gate.Gates: admission state kept across reloads
    ladders: Any = None  # filters.plugins.degrade.state.Ladders: ladder steps kept across reloads
    pickers: Any = (
        None  # filters.plugins.picker.registry.Pickers: prefix indexes kept across reloads
    )
    redis: Any = None  # the server's asyncio Redis client (None: no Redis configured)
    collapser: Any = (
        None  # filters.plugins.collapse.hub.Hub: in-flight collapsed runs across reloads
    )
    shadow: Any = None  # filters.plugins.shadow.recorder.ShadowRecorder: open primary/shadow pairs
    balance: Any = None  # filters.plugins.admission.spread.LaneBalance: ranked pools' replica loads
    topups: Any = None  # quota.topup.TopUps: a stream's draws past its reservation
    aborts: Any = None  # filters.aborts.Aborter: backend aborts of streams stopped at the budget
    pd: Any = None  # filters.plugins.pd.hub.PdHub: PD pools' pair loads and prefill calls
    lengths: OutputLengths | None = (
        None  # learned output lengths (reservations), kept across reloads
    )


def default_services(policy: Any, clock: Callable[[], float]) -> Services:
    """Services without Redis: keys from the policy file, no live budget, the byte bound."""
    return Services(
        policy=policy,
        keys=KeyStore(policy_keys(policy), None, clock=clock),
        budget=NoBudget(),
        estimator=ByteBound(),
        metrics=FilterMetrics(),
        clock=clock,
        lengths=OutputLengths(clock=clock, window=policy.reservation.window),
    )
