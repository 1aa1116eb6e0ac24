"""What plugins get at construction: the policy and the shared, long-lived helpers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from filters.budget import Budget, NoBudget
from filters.estimate import ByteBound, Estimator
from filters.keys import KeyStore, policy_keys
from filters.metrics import FilterMetrics
from filters.output_lengths import OutputLengths
from policy.model import Policy

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from filters.aborts import Aborter
    from filters.plugins.admission.gate import Gates
    from filters.plugins.admission.spread import LaneBalance
    from filters.plugins.collapse.hub import Hub
    from filters.plugins.degrade.state import Ladders
    from filters.plugins.lora.hub import LoraHub
    from filters.plugins.pd.hub import PdHub
    from filters.plugins.picker.registry import Pickers
    from filters.plugins.shadow.recorder import ShadowRecorder
    from quota.topup import TopUps

__all__ = ["Services", "default_services"]


@dataclass(frozen=True)
class Services:
    """Shared by every plugin of a server; ``policy`` is the one the chains were built from."""

    policy: Policy
    keys: KeyStore
    budget: Budget
    estimator: Estimator
    metrics: FilterMetrics
    clock: Callable[[], float]
    gates: Gates | None = (
        None  # filters.plugins.admission.gate.Gates: admission state kept across reloads
    )
    ladders: Ladders | None = (
        None  # filters.plugins.degrade.state.Ladders: ladder steps kept across reloads
    )
    pickers: Pickers | None = (
        None  # filters.plugins.picker.registry.Pickers: prefix indexes kept across reloads
    )
    redis: Redis | None = None  # the server's asyncio Redis client (None: no Redis configured)
    collapser: Hub | None = (
        None  # filters.plugins.collapse.hub.Hub: in-flight collapsed runs across reloads
    )
    shadow: ShadowRecorder | None = (
        None  # filters.plugins.shadow.recorder.ShadowRecorder: open primary/shadow pairs
    )
    balance: LaneBalance | None = (
        None  # filters.plugins.admission.spread.LaneBalance: ranked pools' replica loads
    )
    topups: TopUps | None = None  # quota.topup.TopUps: a stream's draws past its reservation
    aborts: Aborter | None = (
        None  # filters.aborts.Aborter: backend aborts of streams stopped at the budget
    )
    pd: PdHub | None = None  # filters.plugins.pd.hub.PdHub: PD pools' pair loads and prefill calls
    lora: LoraHub | None = None  # filters.plugins.lora.hub.LoraHub: adapter affinity, replica reads
    lengths: OutputLengths | None = (
        None  # learned output lengths (reservations), kept across reloads
    )


def default_services(policy: Policy, clock: Callable[[], float]) -> Services:
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
