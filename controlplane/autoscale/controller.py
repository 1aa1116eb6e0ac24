"""The online planner in the control plane: per autoscaled pool, each ``interval``, the live
demand → the planner's need → bounds, budget and damping → the desired replica count.

Published as ``tokenweir_pool_desired_replicas{pool,reason}`` beside
``tokenweir_pool_replicas{pool}`` (replicas serving: fresh in the pool state), on
``GET /api/v1/autoscale`` (JSON) and on the dashboard. Whoever acts on it (``tokenweir up
--autoscale``, a Kubernetes HPA or KEDA on the metric) reports the replicas it is starting with
:meth:`Autoscaler.set_starting`.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypedDict

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge

from controlplane.planner import PlannerError, ReplicaModel, for_workload, profile_replica
from policy import Policy
from policy.autoscale import AutoscalePolicy
from poolstate import PoolState
from poolstate.counters import ReplicaCounters, parse_counters
from poolstate.valley import RunnerWord, runner_pool
from runtime.tasks import stop_task
from wire.jsontypes import JsonObject

from .demand import DemandWindow
from .lanes import LaneWindow, ordered, without_runners
from .need import replicas_for
from .rates import MEASURED, RateEstimator, Speed, pool_speed
from .stabilize import Decision, Stabilizer

__all__ = ["AUTOSCALE_PATH", "Autoscaler", "PoolPlan", "PoolStatus"]

log = logging.getLogger("tokenweir.autoscale")

AUTOSCALE_PATH = "/api/v1/autoscale"


class PoolStatus(TypedDict):
    """One pool of ``GET /api/v1/autoscale``'s ``pools`` (docs/capacity.md)."""

    desired: int
    reason: str
    needed: int | None
    need_reason: str | None
    slots_per_replica: int | None
    serving: int
    starting: int
    forecast_rps: float
    batch_runner_lines: int  # the batch runners' lines at the replicas (not demand)
    min: int
    max: int
    budget: int | None
    speed: JsonObject  # the factors the pool is sized with, and each replica's measured rates
    lanes: JsonObject  # per lane: share, forecast rate, TTFT budget, replicas it needs


@dataclass
class PoolPlan:
    """One autoscaled pool: its policy, replica model and damping state."""

    policy: AutoscalePolicy
    replica: ReplicaModel
    time_scale: float
    ttft_s: float
    endpoints: tuple[str, ...]
    window: DemandWindow
    stabilizer: Stabilizer
    next_at: float = 0.0
    last: Decision | None = None
    forecast_rps: float = 0.0
    serving: int = 0
    starting: int = 0
    rates: RateEstimator = field(default_factory=RateEstimator)
    speeds: dict[str, Speed] = field(default_factory=dict)
    speed: tuple[float, float, str] = (1.0, 1.0, "profile")
    model: ReplicaModel | None = None  # the profile at the workload now (unscaled)
    budgets: dict[str, float] = field(default_factory=dict)  # lane → TTFT budget
    lanes: LaneWindow = field(default_factory=lambda: LaneWindow(20.0))
    lane_shares: dict[str, float] = field(default_factory=dict)
    slots: int | None = None  # the pool's declared capacity.max_running_requests
    runner_lines: int = 0  # the batch runners' lines at the replicas (not demand)


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.desired = Gauge(
            "tokenweir_pool_desired_replicas",
            "Replicas the online planner asks for, with the reason that binds (ttft, ttft_batch, "
            "tbt, kv, slots, budget, min, max)", ["pool", "reason"], registry=registry,
        )  # fmt: skip
        self.replicas = Gauge(
            "tokenweir_pool_replicas", "Replicas of a pool serving now (fresh in the pool state)",
            ["pool"], registry=registry,
        )  # fmt: skip
        self.needed = Gauge(
            "tokenweir_pool_needed_replicas",
            "Replicas the planner computes for this round's forecast, before bounds and damping",
            ["pool"], registry=registry,
        )  # fmt: skip
        self.starting = Gauge(
            "tokenweir_pool_replicas_starting", "Replicas started and not yet serving",
            ["pool"], registry=registry,
        )  # fmt: skip
        self.rate = Gauge(
            "tokenweir_pool_arrival_rate", "Requests per second arriving at a pool: measured "
            "now (over the window) and forecast (trend projected ahead)", ["pool", "kind"],
            registry=registry,
        )  # fmt: skip
        self.speed = Gauge(
            "tokenweir_pool_speed_factor", "Step time over the backend profile's (2 = twice as "
            "slow) the planner sizes a pool's replicas with, per phase (decode, prefill): "
            "measured from the replicas' metrics, or the time scale until measured",
            ["pool", "phase"], registry=registry,
        )  # fmt: skip
        self.measured = Gauge(
            "tokenweir_pool_speed_measured", "1 when the pool's speed factors rest on the "
            "replicas' measured rates, 0 while they are the profile's", ["pool"],
            registry=registry,
        )  # fmt: skip
        self.replica_speed = Gauge(
            "tokenweir_replica_speed_factor", "A replica's step time over the backend profile's "
            "per phase (decode, prefill), measured from its ITL, TTFT and queue-time histograms",
            ["pool", "endpoint", "phase"], registry=registry,
        )  # fmt: skip
        self.lane_rate = Gauge(
            "tokenweir_pool_lane_arrival_rate", "The forecast arrival rate of a pool split by "
            "lane (admission's admitted + shed by lane), each planned against its own TTFT "
            "budget", ["pool", "lane"], registry=registry,
        )  # fmt: skip
        self.runner_lines = Gauge(
            "tokenweir_pool_batch_runner_lines", "The batch runners' lines at a pool's "
            "replicas as they last said (poolstate/valley.py): the planner leaves them and "
            "those they were answered out of the pool's demand", ["pool"], registry=registry,
        )  # fmt: skip
        self.reasons: dict[str, str] = {}
        self.replicas_seen: dict[str, set[str]] = {}

    def publish(self, pool: str, plan: PoolPlan) -> None:
        d = plan.last
        if d is None:
            return
        old = self.reasons.get(pool)
        if old is not None and old != d.reason:
            self.desired.remove(pool, old)
        self.reasons[pool] = d.reason
        self.desired.labels(pool, d.reason).set(d.desired)
        self.needed.labels(pool).set(d.need.replicas)
        self.rate.labels(pool, "forecast").set(plan.forecast_rps)
        self.runner_lines.labels(pool).set(plan.runner_lines)
        for lane in plan.budgets:
            share = plan.lane_shares.get(lane, 0.0)
            self.lane_rate.labels(pool, lane).set(plan.forecast_rps * share)
        decode, prefill, source = plan.speed
        self.speed.labels(pool, "decode").set(decode)
        self.speed.labels(pool, "prefill").set(prefill)
        self.measured.labels(pool).set(1.0 if source == MEASURED else 0.0)
        seen = self.replicas_seen.setdefault(pool, set())
        for ep in seen - set(plan.speeds):
            for phase in ("decode", "prefill"):
                self.replica_speed.remove(pool, ep, phase)
        for ep, sp in plan.speeds.items():
            if sp.source == MEASURED:
                self.replica_speed.labels(pool, ep, "decode").set(sp.decode)
                self.replica_speed.labels(pool, ep, "prefill").set(sp.prefill)
            elif ep in seen:
                for phase in ("decode", "prefill"):
                    self.replica_speed.remove(pool, ep, phase)
        self.replicas_seen[pool] = {ep for ep, sp in plan.speeds.items() if sp.source == MEASURED}

    def forget(self, pool: str) -> None:
        old = self.reasons.pop(pool, None)
        if old is not None:
            self.desired.remove(pool, old)
        for ep in self.replicas_seen.pop(pool, set()):
            for phase in ("decode", "prefill"):
                self.replica_speed.remove(pool, ep, phase)


class Autoscaler:
    """Owns its loop task; ``aclose`` stops it. ``tap`` goes to the pool scraper, ``on_state``
    is a pool-state listener, ``configure`` runs on every accepted policy."""

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        registry: CollectorRegistry | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._metrics = _Metrics(registry) if registry is not None else None
        self.pools: dict[str, PoolPlan] = {}
        self._counters: dict[str, tuple[float, ReplicaCounters]] = {}  # when read, what
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._starting_listeners: list[Callable[[str, int, float | None], None]] = []
        # pool → its batch runners' words (poolstate/valley.py): their lines are no demand
        self.valley: Callable[[str], Mapping[str, RunnerWord]] = lambda pool: {}

    # ---- inputs ------------------------------------------------------------------------------
    def configure(self, policy: Policy) -> None:
        """The autoscaled pools of ``policy``; a pool keeps its history across reloads."""
        keep: dict[str, PoolPlan] = {}
        for name, pool in policy.pools.items():
            a = pool.autoscale
            if a is None:
                continue
            em = pool.emulated
            profile = a.profile or (em.profile if em is not None else None)
            try:
                replica = profile_replica(profile or "")
            except PlannerError as exc:  # check.py refused this policy already; be safe
                log.error("pool %s: autoscale.profile: %s", name, exc)
                continue
            scale = a.time_scale or (em.time_scale if em is not None else 1.0)
            eps = tuple(str(ep) for ep in pool.endpoints)
            old = self.pools.get(name)
            ttft = policy.admission.interactive.ttft_budget
            budgets = {
                "interactive": ttft, "batch": policy.admission.batch.ttft_budget,
            }  # fmt: skip
            if old is not None and old.policy == a:
                old.replica, old.time_scale, old.ttft_s, old.endpoints = replica, scale, ttft, eps
                old.budgets, old.slots = budgets, pool.capacity.max_running_requests
                old.window.forget(set(eps))
                old.rates.forget(eps)
                keep[name] = old
                continue
            start = min(max(len(eps), a.min_replicas), a.max_replicas)
            window = old.window if old is not None else DemandWindow(a.window)
            window.window_s = a.window
            plan = PoolPlan(
                a, replica, scale, ttft, eps, window, Stabilizer(a, start), budgets=budgets,
                slots=pool.capacity.max_running_requests,
            )  # fmt: skip
            if old is not None:  # measured speeds and lanes outlive a change of the keys
                old.rates.forget(eps)
                plan.rates, plan.lanes = old.rates, old.lanes
            plan.lanes.window_s = a.window
            keep[name] = plan
        for gone in set(self.pools) - set(keep):
            if self._metrics is not None:
                self._metrics.forget(gone)
        self.pools = keep

    @staticmethod
    def valley_pools(policy: Policy) -> tuple[str, ...]:
        """The autoscaled pool the batch runners fill, where runners run: its runners' words
        are read (poolstate/valley.py)."""
        pool = runner_pool(policy)
        return (pool,) if pool is not None and policy.pools[pool].autoscale is not None else ()

    def tap(self, endpoint: str, text: str) -> None:
        counters = parse_counters(text)
        if counters is not None:
            self._counters[endpoint] = (self._clock(), counters)

    def on_lanes(self, now: float, arrivals: Mapping[tuple[str, str], float]) -> None:
        """Admission's arrivals by (pool, lane) summed over the filter processes, cumulative
        (the dashboard collector's round: admitted + shed)."""
        by_pool: dict[str, dict[str, float]] = {}
        for (pool, lane), v in arrivals.items():
            by_pool.setdefault(pool, {})[lane] = by_pool.get(pool, {}).get(lane, 0.0) + v
        for name, plan in self.pools.items():
            plan.lanes.observe(now, by_pool.get(name, {}))

    def on_state(self, state: PoolState) -> None:
        for name, summary in state.pools.items():
            serving = sum(1 for r in summary.endpoints.values() if r.healthy and not r.stale)
            if name in self.pools:
                self.pools[name].serving = serving
            if self._metrics is not None:
                self._metrics.replicas.labels(name).set(serving)

    def set_starting(self, pool: str, count: int, ready_in_s: float | None = None) -> None:
        """Replicas an actor has started for ``pool`` that do not serve yet, the first
        expected to serve in ``ready_in_s`` (None: unknown). Passed on to every
        :meth:`follow_starting` listener (the pool scraper publishes it in the pool state:
        admission shortens the Retry-After it promises to that, where shorter)."""
        if pool in self.pools:
            self.pools[pool].starting = count
        if self._metrics is not None:
            self._metrics.starting.labels(pool).set(count)
        for listener in self._starting_listeners:
            listener(pool, count, ready_in_s)

    def follow_starting(self, listener: Callable[[str, int, float | None], None]) -> None:
        """Called with ``(pool, starting, ready_in_s)`` on every :meth:`set_starting`."""
        self._starting_listeners.append(listener)

    # ---- one round ---------------------------------------------------------------------------
    def tick(self) -> dict[str, Decision]:
        """Every pool whose interval is due: observe, plan, damp. Returns the new decisions."""
        now = self._clock()
        out = {}
        for name, plan in self.pools.items():
            if now < plan.next_at:
                continue
            plan.next_at = now + plan.policy.interval
            read = {ep: self._counters[ep] for ep in plan.endpoints if ep in self._counters}
            seen = {ep: c for ep, (_, c) in read.items()}
            words = self.valley(name)
            plan.runner_lines = sum(w.lines for w in words.values())
            plan.window.observe(now, seen, words)
            demand = plan.window.demand()
            a = plan.policy
            plan.forecast_rps = demand.forecast_rps(a.forecast)
            self._measure(name, plan, read, demand.prompt_mean, demand.output_mean,
                          demand.hit_rate)  # fmt: skip
            decode, prefill, _ = plan.speed
            lanes = ordered(without_runners(plan.lanes.shares(), demand.runner_share), plan.budgets)
            plan.lane_shares = {ld.lane: ld.share for ld in lanes}
            need = replicas_for(
                demand, plan.forecast_rps, plan.replica, ttft_s=plan.ttft_s,
                tbt_s=a.tbt_budget, headroom=a.headroom, time_scale=decode,
                prefill_scale=prefill, lanes=lanes, slots=plan.slots,
            )  # fmt: skip
            before = plan.last.desired if plan.last is not None else None
            plan.last = plan.stabilizer.step(now, need)
            if plan.last.desired != before:
                log.info(
                    "pool %s: desired replicas %s → %d (%s; %.3g req/s now, %.3g forecast)",
                    name, before, plan.last.desired, plan.last.reason, demand.arrival_rps,
                    plan.forecast_rps,
                )  # fmt: skip
                self._changed.set()
                self._changed = asyncio.Event()
            if self._metrics is not None:
                self._metrics.rate.labels(name, "now").set(demand.arrival_rps)
                self._metrics.publish(name, plan)
            out[name] = plan.last
        return out

    def _measure(
        self, name: str, plan: PoolPlan, read: dict[str, tuple[float, ReplicaCounters]],
        prompt: float, output: float, hit: float,
    ) -> None:  # fmt: skip
        """Each replica's speed from this round's pages, and the pool's (rates.py)."""
        model, _ = for_workload(plan.replica, prompt, output, hit)
        plan.model = model
        for ep, (at, counters) in read.items():
            plan.rates.observe(ep, counters, model, at)
        plan.speeds = {ep: plan.rates.speed(ep, plan.time_scale) for ep in plan.endpoints}
        before = plan.speed[2]
        plan.speed = pool_speed(plan.speeds.values(), plan.time_scale)
        if plan.speed[2] != before:
            log.info(
                "pool %s: replica rates now from the %s (decode ×%.3g, prefill ×%.3g of %s)",
                name, "replicas' metrics" if plan.speed[2] == MEASURED else "profile",
                plan.speed[0], plan.speed[1], plan.replica.name,
            )  # fmt: skip

    def desired(self, pool: str) -> int | None:
        plan = self.pools.get(pool)
        return None if plan is None else plan.stabilizer.desired

    def to_json(self) -> dict[str, dict[str, PoolStatus]]:
        out: dict[str, PoolStatus] = {}
        for name, plan in self.pools.items():
            d = plan.last
            out[name] = {
                "desired": plan.stabilizer.desired,
                "reason": plan.stabilizer.reason,
                "needed": d.need.replicas if d else None,
                "need_reason": d.need.reason if d else None,
                "slots_per_replica": d.need.slots if d else None,
                "serving": plan.serving,
                "starting": plan.starting,
                "forecast_rps": _round(plan.forecast_rps),
                "batch_runner_lines": plan.runner_lines,
                "min": plan.policy.min_replicas,
                "max": plan.policy.max_replicas,
                "budget": plan.policy.budget_replicas,
                "speed": self._speed_json(plan),
                "lanes": self._lanes_json(plan),
            }
        return {"pools": out}

    @staticmethod
    def _lanes_json(plan: PoolPlan) -> JsonObject:
        """Per lane: its share of the arrivals, its forecast rate, its TTFT budget and the
        replicas that budget needs (None: no arrivals in the lane)."""
        needs = dict(plan.last.need.lanes) if plan.last is not None else {}
        out: JsonObject = {}
        for lane, budget in plan.budgets.items():
            share = plan.lane_shares.get(lane, 0.0)
            out[lane] = {
                "share": _round(share), "forecast_rps": _round(plan.forecast_rps * share),
                "ttft_budget": budget, "needed": needs.get(lane),
            }  # fmt: skip
        return out

    @staticmethod
    def _speed_json(plan: PoolPlan) -> JsonObject:
        """The factors the pool is sized with, and per replica its measured rates: prefill
        tok/s and the time between tokens at the planned batch (the slots per replica)."""
        c = plan.last.need.slots if plan.last is not None and plan.last.need.slots else 1
        model = plan.model
        replicas: JsonObject = {}
        for ep, sp in plan.speeds.items():
            row: JsonObject = {
                "source": sp.source, "decode": _round(sp.decode), "prefill": _round(sp.prefill),
                "token_gaps": sp.gaps, "first_tokens": sp.first,
            }  # fmt: skip
            if model is not None:
                row["prefill_tok_s"] = _round(model.prefill_tok_s / sp.prefill)
                row["itl_ms_at_slots"] = _round(model.itl_s(c) * sp.decode * 1e3)
            replicas[ep] = row
        decode, prefill, source = plan.speed
        return {
            "source": source, "decode": _round(decode), "prefill": _round(prefill),
            "replicas": replicas,
        }  # fmt: skip

    def routes(self) -> list[web.RouteDef]:
        async def get(_request: web.Request) -> web.Response:
            return web.json_response(self.to_json(), headers={"Cache-Control": "no-store"})

        return [web.get(AUTOSCALE_PATH, get)]

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="tokenweir-autoscale")

    async def _run(self) -> None:
        while True:
            try:
                self.tick()
            except Exception:  # a bug in one round must not end the loop; logged, next round
                log.exception("autoscale round failed")
            step = min((p.policy.interval for p in self.pools.values()), default=1.0)
            await self._sleep(min(step, 1.0))

    async def aclose(self) -> None:
        task, self._task = self._task, None
        await stop_task(task, log=log)


def _round(x: float) -> float:
    return round(x, 4) if math.isfinite(x) else x
