"""The tokenweir arms of the overload benchmark (the others: :mod:`overload_arms`), and
``make_arm``, which builds any arm by name.

- ``tokenweir``: ``tokenweir up`` on ``bench/overload_policy.yaml`` with this run's ports and
  endpoints (lanes, tiers, quotas in Redis, admission, pool state: whatever main has).
- ``tokenweir-baseline``: the same, but every tokenweir process imports the code of another
  checkout (``--baseline-src``, e.g. ``git archive main``): before/after of a change in one run.
- ``tokenweir-alt``: this policy, every knob included, on the ``--baseline-src`` checkout.
- ``tokenweir-variant``: this policy with a :class:`Variant` (policy keys merged in, flags added
  to its emulators), beside the default arm on the same arrivals.
- ``tokenweir-no-reserve``, ``tokenweir-no-priority``, ``tokenweir-ring``: one knob off.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from overload_arms import (
    DROP,
    POLICY,
    Arm,
    EmulatorPool,
    InteractiveAlone,
    PlainEnvoy,
    PoolSpec,
    SglangRouter,
)

from runtime.children import wait_child_line, wait_child_port
from runtime.ports import free_port

__all__ = ["Tokenweir", "Variant", "bench_policy", "make_arm", "merge"]


class Tokenweir(Arm):
    name = "tokenweir"
    # the policy's pools.chat.priority_scheduling: the backends rank by the lane's priority
    emulator_args = ("--enable-priority-scheduling",)
    overrides: dict[str, Any] = {}  # noqa: RUF012 - replaced per instance, never mutated

    async def start(self) -> None:
        policy = merge(bench_policy(self.pool, self.port, self.pool.spec), self.overrides)
        path = self.run_dir / "tokenweir-policy.yaml"
        path.write_text(yaml.safe_dump(policy, sort_keys=False))
        metrics_port = policy["filters"]["metrics_port"]
        self.queue_metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        argv = [
            str(Path(sys.executable).parent / "tokenweir"), "--log-level", "warning", "up",
            "--no-prometheus", "-c", str(path), "--run-dir", str(self.run_dir / "tokenweir-up"),
            "--drain-timeout", "1",
        ]  # fmt: skip
        child = self._spawn("tokenweir-up", argv)
        self.access_log = self.run_dir / "tokenweir-up" / "envoy-edge-0.log"
        await wait_child_port("127.0.0.1", self.port, child, timeout=90)
        await wait_child_line(child, "tokenweir up: ready")


class TokenweirNoReserve(Tokenweir):
    name = "tokenweir-no-reserve"
    overrides: dict[str, Any] = {"admission": {"batch": {"leave_for_higher": None}}}  # noqa: RUF012


class TokenweirNoPriority(Tokenweir):
    name = "tokenweir-no-priority"
    emulator_args = ()
    overrides: dict[str, Any] = {"pools": {"chat": {"priority_scheduling": DROP}}}  # noqa: RUF012


class TokenweirRing(Tokenweir):
    name = "tokenweir-ring"
    overrides: dict[str, Any] = {  # noqa: RUF012
        "pools": {"chat": {"priority_scheduling": {"enabled": True, "balance": "ring"}}}
    }


class TokenweirBaseline(Tokenweir):
    name = "tokenweir-baseline"
    # another checkout's code: it may not know the knob, so the pool does not rank by priority
    emulator_args = ()
    overrides = TokenweirNoPriority.overrides


class TokenweirAlt(Tokenweir):
    """The tokenweir arm on another checkout's code (``--baseline-src``) with every knob of
    this one (the priority-ranked pool included): that code must know them all. For a change
    inside the code, not the policy, measured beside the code without it."""

    name = "tokenweir-alt"


@dataclass(frozen=True)
class Variant:
    """What the ``tokenweir-variant`` arm changes: keys merged into this policy (mappings key by
    key), and flags added to its emulators (e.g. ``--chunked-prefill-size 1024``)."""

    policy: dict[str, Any] = field(default_factory=dict)
    emulator_args: tuple[str, ...] = ()


class TokenweirVariant(Tokenweir):
    """The tokenweir arm with a :class:`Variant` (``--variant-policy``,
    ``--variant-emulator-args``): a policy or backend setting measured beside the default."""

    name = "tokenweir-variant"

    def __init__(self, pool: EmulatorPool, run_dir: Path, variant: Variant) -> None:
        self.emulator_args = (*Tokenweir.emulator_args, *variant.emulator_args)
        self.overrides = variant.policy
        super().__init__(pool, run_dir)


def bench_policy(pool: EmulatorPool, gateway_port: int, spec: PoolSpec) -> dict[str, Any]:
    """``bench/overload_policy.yaml`` with this run's ports, endpoints and pool capacity."""
    policy: dict[str, Any] = yaml.safe_load(POLICY.read_text())
    cp = policy.setdefault("control_plane", {})
    cp["xds"] = f"127.0.0.1:{free_port()}"
    cp["metrics"] = f"127.0.0.1:{free_port()}"
    policy["ratelimit"].update(address=f"127.0.0.1:{free_port()}", metrics_port=free_port())
    policy["filters"].update(address=f"127.0.0.1:{free_port()}", metrics_port=free_port())
    chat = policy["pools"]["chat"]
    chat["endpoints"] = [f"127.0.0.1:{p}" for p in pool.ports]
    chat.setdefault("capacity", {})["max_running_requests"] = spec.running
    policy["gateways"]["edge"]["listen"] = f"127.0.0.1:{gateway_port}"
    return policy


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra``'s keys set, mappings merged key by key."""
    out = dict(base)
    for key, value in extra.items():
        if value is DROP:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def make_arm(
    name: str,
    pool: EmulatorPool,
    run_dir: Path,
    baseline: Path | None = None,
    variant: Variant | None = None,
) -> Arm:
    kinds: dict[str, type[Arm]] = {
        "envoy": PlainEnvoy,
        "interactive-alone": InteractiveAlone,
        "sglang-router": SglangRouter,
        "tokenweir": Tokenweir,
        "tokenweir-no-reserve": TokenweirNoReserve,
        "tokenweir-no-priority": TokenweirNoPriority,
        "tokenweir-ring": TokenweirRing,
        "tokenweir-baseline": TokenweirBaseline,
        "tokenweir-alt": TokenweirAlt,
    }
    if name == "tokenweir-variant":
        return TokenweirVariant(pool, run_dir, variant if variant is not None else Variant())
    if name in ("tokenweir-baseline", "tokenweir-alt"):
        if baseline is None:
            raise ValueError(f"the {name} arm needs --baseline-src")
        return kinds[name](pool, run_dir, baseline)
    return kinds[name](pool, run_dir)
