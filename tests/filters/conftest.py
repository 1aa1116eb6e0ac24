from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from filters.api import Context, RouteInfo
from filters.budget import NoBudget
from filters.estimate import ByteBound
from filters.keys import KeyStore, policy_keys
from filters.metrics import FilterMetrics
from filters.output_lengths import OutputLengths
from filters.services import Services
from policy import Policy, load_policy
from policy.scheduling import PriorityScheduling

ROOT = Path(__file__).resolve().parents[2]


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeBudget:
    def __init__(self, left: dict[str, int | None]) -> None:
        self.left = left
        self.calls: list[tuple[str, str | None, str | None]] = []
        self.reserved: list[int] = []

    def note_reserved(self, tenant: str, model: str | None, lane: str | None, tokens: int) -> None:
        self.reserved.append(tokens)

    def cached(self, tenant: str, model: str | None, lane: str | None) -> tuple[bool, int | None]:
        return False, None  # every clamp reads (and a slow read is what some tests need)

    async def remaining(
        self, tenant: str, model: str | None = None, lane: str | None = None
    ) -> int | None:
        self.calls.append((tenant, model, lane))
        return self.left.get(tenant)


@pytest.fixture
def policy() -> Policy:
    """The example policy with its chat pool not ranking requests by priority: the tests that
    need priority scheduling turn it on themselves."""
    example = load_policy(ROOT / "examples" / "mesh.yaml")
    chat = replace(example.pools["chat"], priority_scheduling=PriorityScheduling())
    return replace(example, pools={**example.pools, "chat": chat})


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_services(
    policy: Policy, clock: FakeClock, budget: Any = None, redis: Any = None
) -> Services:
    return Services(
        policy=policy,
        keys=KeyStore(policy_keys(policy), redis, clock=clock),
        budget=budget if budget is not None else NoBudget(),
        estimator=ByteBound(),
        metrics=FilterMetrics(),
        clock=clock,
        lengths=OutputLengths(clock=clock),
    )


@pytest.fixture
def services(policy: Policy, clock: FakeClock) -> Services:
    return make_services(policy, clock)


ROUTE = RouteInfo(
    name="chat-completions",
    pool="chat",
    models=("llama-3.1-8b",),
    prefix_tokens=256,
    max_body_bytes=1024**2,
    rate_limited=True,
)


def make_ctx(path: str = "/v1/chat/completions", route: RouteInfo = ROUTE, **kw: Any) -> Context:
    ctx = Context(route=route, started=1000.0, method="POST", path=path)
    for k, v in kw.items():
        setattr(ctx, k, v)
    return ctx
