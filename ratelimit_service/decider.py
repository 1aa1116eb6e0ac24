"""The decision core behind the gRPC servicer: RateLimitRequest in, RateLimitResponse out.

It never raises: bad input gets a defined OVER_LIMIT answer and a log line, a Redis outage the
policy's failure mode (open: this replica's local bucket holding its share of every limit;
closed: OVER_LIMIT), both within ``deadline`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from envoy.service.ratelimit.v3 import rls_pb2
from prometheus_client import Counter

from quota.config import Limit, SubjectQuotas, limits_for_service, limits_for_tenant
from quota.cost import price_factor, worst_case_micro_usd
from quota.keys import record_key, service_subject
from ratelimit_service.descriptors import Call, parse_request
from ratelimit_service.directory import QuotaDirectory
from ratelimit_service.errors import BadRequest, StoreUnavailable
from ratelimit_service.false_rejects import FalseRejects
from ratelimit_service.health import RedisHealth
from ratelimit_service.limiter import Check, ReserveResult
from ratelimit_service.metrics import Metrics
from ratelimit_service.outage import OutageLedger
from ratelimit_service.plan import WindowClock, checks_for, scaled
from ratelimit_service.responses import Verdict, error_response, response
from ratelimit_service.store import MemoryStore, QuotaStore
from runtime.tasks import stop_task
from wire.contract import RATELIMIT_DOMAIN

__all__ = ["CallTrace", "Decider", "DeciderSettings", "verdict"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class CallTrace:
    """A traced call (tracing on only): ``incoming``, the traceparent it carried, is kept with
    the reservation it makes; ``settled``, what its settlement found there (Envoy 1.40's
    stream-done call carries no trace context of its own)."""

    incoming: str | None = None
    settled: str | None = None


@dataclass(frozen=True)
class DeciderSettings:
    domain: str = RATELIMIT_DOMAIN
    failure_mode: str = "open"  # Redis down: "open" (local bucket) or "closed" (deny)
    deadline: float = 0.03  # seconds we wait for Redis before the fallback answers (the store's)
    reservation_ttl_ms: int = 600_000
    replicas: int = 1  # the local bucket holds 1/replicas of every limit


def verdict(
    res: ReserveResult,
    limits: list[Limit],
    checks: list[Check],
    hits: int,
    now_us: int,
    subject: str,
    usd: int = 0,
) -> Verdict:
    """Report the denying limit with the longest wait, else the tightest enforced limit."""
    outcomes = res.outcomes
    shadow = tuple(
        f"{x.quota}.{x.unit}"
        for x, o in zip(limits, outcomes, strict=True)
        if x.shadow and not o.ok
    )
    best = -1
    best_key = -math.inf
    for i, (lim, o) in enumerate(zip(limits, outcomes, strict=True)):
        if lim.shadow or (not res.admitted and o.ok):
            continue
        if res.admitted:
            key = -float(o.remaining)
        else:
            key = math.inf if o.retry_us < 0 else float(o.retry_us)
        if key > best_key:
            best, best_key = i, key
    if best < 0:
        return Verdict(ok=res.admitted, shadow_denied=shadow)
    lim, o = limits[best], outcomes[best]
    if lim.unit != "bucket":
        reset = checks[best].reset_us - now_us
    elif lim.rate > 0:
        reset = math.ceil((lim.limit - o.remaining) * 1e6 / lim.rate)
    else:
        reset = 0
    return Verdict(
        ok=res.admitted,
        quota=lim.quota,
        unit=lim.unit,
        limit=lim.limit,
        remaining=o.remaining,
        reset_us=max(0, reset),
        retry_us=o.retry_us,
        requested=usd if lim.money else hits if lim.tokens else 1,
        kind="usd" if lim.money else "tokens" if lim.tokens else "requests",
        subject=subject,
        shadow_denied=shadow,
    )


class Decider:
    def __init__(
        self,
        settings: DeciderSettings,
        *,
        directory: QuotaDirectory,
        store: QuotaStore | None,
        health: RedisHealth | None,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.directory = directory
        self.store = store
        self.health = health
        self.local = MemoryStore()
        self.metrics = metrics
        self.clock = clock
        self._last_log: dict[str, float] = {}
        self._counters: dict[tuple[bool, str, str], Counter] = {}
        self._tenant_counters: dict[tuple[str, bool], Counter] = {}
        self._limits: dict[
            tuple[str, str | None, str | None], tuple[SubjectQuotas, list[Limit]]
        ] = {}
        self._windows = WindowClock()
        self._reserved = metrics.tokens.labels("reserved")
        self.false_rejects = FalseRejects()
        # what the local buckets spent while Redis was down, charged into Redis once it is back
        self.outage = OutageLedger(settings.reservation_ttl_ms * 1000)
        self._reconcile: asyncio.Task[None] | None = None
        self._decision_seconds = metrics.decision_seconds

    def _log_limited(self, key: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last_log.get(key, 0.0) >= 1.0:
            self._last_log[key] = now
            log.warning(msg, *args)

    async def decide(
        self, request: rls_pb2.RateLimitRequest, trace: CallTrace | None = None
    ) -> rls_pb2.RateLimitResponse:
        started = time.perf_counter()
        try:
            return await self._decide(request, trace)
        finally:
            self._decision_seconds.observe(time.perf_counter() - started)

    async def _decide(
        self, request: rls_pb2.RateLimitRequest, trace: CallTrace | None
    ) -> rls_pb2.RateLimitResponse:
        try:
            calls = parse_request(request, self.settings.domain)
            verdicts = [await self._one(call, trace) for call in calls]
        except BadRequest as exc:
            self.metrics.bad_requests.labels(exc.code).inc()
            self.metrics.decisions.labels("invalid", "").inc()
            self._log_limited(exc.code, "bad rate-limit request (%s): %s", exc.code, exc)
            return error_response(str(exc), exc.code, "invalid_request_error")
        except StoreUnavailable as exc:  # failure mode "closed"
            self.metrics.decisions.labels("unavailable", "").inc()
            self._log_limited("closed", "denying: quota store unavailable (%s)", exc)
            return error_response(
                "The quota service cannot check your budget right now.",
                "quota_unavailable",
                "service_unavailable",
                retry_s=1,
            )
        return response(verdicts)

    async def _one(self, call: Call, trace: CallTrace | None = None) -> Verdict:
        if call.phase == "settle":
            await self._settle(call, trace)
            return Verdict(ok=True)
        if call.phase == "requests":
            sq = await self.directory.service(call.service or "")
            subject = service_subject(call.service or "", call.remote_address or "-")
            return await self._reserve(subject, limits_for_service(sq), call, None)
        tenant = call.tenant or ""
        sq = await self.directory.tenant(tenant)
        if not sq.known:
            raise BadRequest(f"unknown tenant {tenant!r}", "unknown_tenant")
        key = (tenant, call.model, call.lane)
        hit = self._limits.get(key)
        if hit is not None and hit[0] is sq:  # the same effective quotas: the same limits
            limits = hit[1]
        else:
            limits = limits_for_tenant(sq, call.model, call.lane)
            if len(self._limits) > 100_000:
                self._limits.clear()
            self._limits[key] = (sq, limits)
        if call.request_id is None:
            self._log_limited("no_request_id", "reserve without request_id: it cannot be settled")
        usd = 0
        if any(x.money for x in limits):  # the worst case: every token at the dearer price
            usd = self._worst_case(call)
        tp = trace.incoming if trace is not None and call.request_id is not None else None
        return await self._reserve(tenant, limits, call, call.request_id, usd, tp)

    async def _reserve(
        self,
        subject: str,
        limits: list[Limit],
        call: Call,
        rid: str | None,
        usd: int = 0,
        trace: str | None = None,
    ) -> Verdict:
        if not limits:
            self.metrics.decisions.labels("ok", "").inc()
            return Verdict(ok=True)
        now_us = int(self.clock() * 1_000_000)
        record = record_key(subject, rid or "-")
        ttl = self.settings.reservation_ttl_ms
        res: ReserveResult | None = None
        if self.store is not None and (self.health is None or self.health.up):
            if len(self.outage) and (self._reconcile is None or self._reconcile.done()):
                self._reconcile = asyncio.get_running_loop().create_task(self.reconcile())
            checks = checks_for(subject, limits, call.hits, now_us, self._windows, usd=usd)
            try:
                res = await self.store.reserve(record, rid is not None, checks, now_us, ttl, trace)
            except (StoreUnavailable, TimeoutError) as exc:
                if self.health is not None:
                    self.health.failed(exc)
        if res is None:
            self.metrics.fallbacks.labels(self.settings.failure_mode).inc()
            if self.settings.failure_mode == "closed":
                raise StoreUnavailable("redis unavailable")
            whole = limits
            limits = scaled(limits, self.settings.replicas)
            checks = checks_for(subject, limits, call.hits, now_us, self._windows, usd=usd)
            res = await self.local.reserve(record, rid is not None, checks, now_us, ttl, trace)
            if res.admitted and self.store is not None and rid is not None:
                key = (subject, call.model, call.lane)
                self.outage.reserved(record, key, whole, call.hits, usd, now_us)
        v = verdict(res, limits, checks, call.hits, now_us, subject, usd)
        self._count(v, call)
        if call.phase == "reserve":
            self.metrics.observe_quota(subject, limits, res.outcomes)
        return v

    async def reconcile(self) -> None:
        """Charge into Redis what the local buckets spent while it was down (:mod:`.outage`):
        per subject, once its local reservations are settled, one reservation of nothing (it
        names every counter the subject's limits use) settled at what was spent. Runs while
        anything is left and Redis answers; what fails is kept for the next run."""
        m = self.metrics
        while len(self.outage) and self.store is not None:
            if self.health is not None and not self.health.up:
                return
            now_us = int(self.clock() * 1_000_000)
            for spent in self.outage.due(now_us):
                if spent.tokens <= 0 and spent.usd <= 0:
                    continue
                checks = checks_for(spent.subject, spent.limits, 0, now_us, self._windows, usd=0)
                record = record_key(spent.subject, f"outage-{uuid.uuid4().hex}")
                ttl = self.settings.reservation_ttl_ms
                try:
                    res = await self.store.reserve(record, True, checks, now_us, ttl)
                    if not res.admitted:  # already in debt: nothing can be added
                        m.outage_charges.labels("refused").inc()
                        continue
                    await self.store.settle(record, spent.tokens, now_us, spent.usd)
                except (StoreUnavailable, TimeoutError) as exc:
                    self.outage.put_back(spent)
                    m.outage_charges.labels("failed").inc()
                    if self.health is not None:
                        self.health.failed(exc)
                    return
                m.outage_charges.labels("charged").inc()
                m.outage_tokens.inc(max(0, spent.tokens))
                log.info(
                    "charged %s's %d tokens spent while redis was down", spent.subject, spent.tokens
                )
            if len(self.outage):
                await asyncio.sleep(1.0)  # reservations still open: their settlements first

    async def aclose(self) -> None:
        await self.directory.aclose()
        if self._reconcile is not None:
            await stop_task(self._reconcile)
            self._reconcile = None

    def _count(self, v: Verdict, call: Call) -> None:
        key = (v.ok, v.quota, v.unit)
        counter = self._counters.get(key)
        if counter is None:
            quota = f"{self.metrics.labels.quota(v.quota)}.{v.unit}" if v.quota else ""
            counter = self.metrics.decisions.labels("ok" if v.ok else "over_limit", quota)
            self._counters[key] = counter
        counter.inc()
        if call.phase == "reserve":
            tenant = self.metrics.tenant_label(call.tenant)
            tkey = (tenant, v.ok)
            child = self._tenant_counters.get(tkey)
            if child is None:  # labels() costs as much as the rest of the counting
                if len(self._tenant_counters) > 50_000:
                    self._tenant_counters.clear()
                outcome = "ok" if v.ok else "over_limit"
                child = self._tenant_counters[tkey] = self.metrics.tenant_decisions.labels(
                    tenant, outcome
                )
            child.inc()
            if not v.ok and v.retry_us >= 0:
                self.metrics.retry_after.labels(tenant).observe(max(1, math.ceil(v.retry_us / 1e6)))
            if not v.ok and v.kind == "tokens" and call.tenant is not None:
                shortfall = v.requested - v.remaining
                self.false_rejects.rejected(call.tenant, self.clock(), shortfall)
        for q in v.shadow_denied:
            self.metrics.shadow_denials.labels(q).inc()
        if v.ok and call.phase == "reserve":
            self._reserved.inc(call.hits)

    def _worst_case(self, call: Call) -> int:
        """Micro-USD of ``call.hits`` tokens at the dearer price, times the price factor of the
        call's route (a batch line's reservation at the batch price: quota.cost)."""
        policy = self.directory.policy
        factor = price_factor(policy, call.route)
        return worst_case_micro_usd(policy, call.model, call.hits, factor)

    async def _settle(self, call: Call, trace: CallTrace | None = None) -> None:
        if call.request_id is None:
            self._log_limited("settle_no_id", "settle without request_id: ignored")
            self.metrics.settles.labels("lost").inc()
            return
        record = record_key(call.tenant or "", call.request_id)
        now_us = int(self.clock() * 1_000_000)
        usd = call.usd
        if usd is None:  # no price from the filter server: what the reserve charged for this many
            usd = self._worst_case(call)
        if self.local.has_record(record):
            res = await self.local.settle(record, call.hits, now_us, usd)
            result = "local"
            if res.found:
                self.outage.settled(record, call.hits, usd)
        elif self.store is not None and (self.health is None or self.health.up):
            try:
                res = await self.store.settle(record, call.hits, now_us, usd)
            except (StoreUnavailable, TimeoutError) as exc:
                if self.health is not None:
                    self.health.failed(exc)
                self.metrics.settles.labels("lost").inc()
                return
            result = "settled" if res.found else "not_found"
        else:
            self.metrics.settles.labels("lost").inc()
            return
        self.metrics.settles.labels(result).inc()
        if trace is not None:
            trace.settled = res.trace
        if res.found:
            self.metrics.tokens.labels("settled").inc(call.hits)
            if res.delta < 0:
                self.metrics.tokens.labels("refunded").inc(-res.delta)
                if call.tenant is not None:
                    false = self.false_rejects.refunded(call.tenant, self.clock(), -res.delta)
                    if false:
                        tenant = self.metrics.tenant_label(call.tenant)
                        self.metrics.false_rejects.labels(tenant).inc(false)
            elif res.delta > 0:
                self.metrics.tokens.labels("extra").inc(res.delta)
