"""admission: priority admission at the request headers (after identity and lane).

The request waits here, holding Envoy's request headers, until its pool has a free slot;
interactive before batch, tenants weighted by tier inside a lane. A full queue or a wait it
cannot afford is answered at once: 503 with ``Retry-After`` from the lane's predicted drain rate
and an OpenAI-style body naming the reason, and so is a waiting request as soon as its predicted
start moves past its budget (``fell_behind``); a client deadline that passes is answered 504. The
slot is freed at the end of the stream (or when the client goes away).

The lane is the one the lane plugin chose from the tenant's tier (a client header cannot raise
it); a client deadline only shortens the wait, it never moves a request forward.

For a ranked pool (``pool.balances_lanes``) it also names the admitted request's replica
(``x-tokenweir-endpoint``, Envoy's override-host): the one with the fewest requests in flight
this request cannot preempt (:mod:`filters.plugins.admission.spread`).

Settings: ``tokens_from_length`` (default true: with ``capacity.max_total_tokens`` declared, a
request counts ``content-length / 4`` tokens against it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from filters.api import BasePlugin, Context, Reply, Result, Slot, openai_error
from filters.errors import ConfigError
from filters.plugins.admission.core import Shed
from filters.plugins.admission.deadline import DEADLINE_HEADER, TIMEOUT_HEADER, remaining_seconds
from filters.plugins.admission.gate import Gates, PoolGate
from filters.plugins.admission.queues import Ticket
from filters.plugins.admission.spread import LaneBalance
from filters.plugins.tokens.plugin import backend_priority
from filters.services import Services
from policy.batch_checks import batch_line_routes
from policy.routing import ENDPOINT_HEADER

__all__ = ["AdmissionPlugin", "return_key", "shed_reply"]

UPSTREAM_TIMEOUT = "x-envoy-upstream-rq-timeout-ms"  # Envoy's router ends the request then


@dataclass(frozen=True, slots=True)
class _Held:
    """The slot a request holds in its pool's gate until its response ends."""

    gate: PoolGate
    ticket: Ticket


_HELD: Slot[_Held] = Slot("admission")
_MESSAGES = {
    "queue_full": "the {lane} queue of this model is full",
    "tenant_queue_full": "you have too many {lane} requests waiting for this model",
    "wait_too_long": "this model cannot start a {lane} request within its wait budget",
    "fell_behind": "this model fell behind: your queued {lane} request can no longer start "
    "within its wait budget",
    "timed_out": "this model had no free slot for your {lane} request within its wait budget",
    "deadline": "the request deadline passed before this model could start it",
    "degraded": "this model is overloaded and sheds {lane} requests of your tier for now",
}


def return_key(tenant: str, headers: Mapping[str, str]) -> tuple[str, str, str]:
    """What recognises a shed client when it sends the same request again as its
    ``Retry-After`` said: its tenant (authenticated: one tenant cannot use another's place)
    and the request's ``content-length`` and ``Idempotency-Key`` (a retry sends the same
    body). A different request of the same tenant and size may take the place instead: the
    tenant still gets only the places it was promised."""
    return tenant, headers.get("content-length", ""), headers.get("idempotency-key", "")


def shed_reply(shed: Shed, lane: str) -> Reply:
    """The one place a :class:`Shed` becomes an HTTP answer."""
    message = _MESSAGES.get(shed.reason, "overloaded").format(lane=lane)
    headers = {"retry-after": str(shed.retry_after_s)}
    headers["retry-after-ms"] = str(max(1, round(shed.retry_after * 1000)))
    if shed.status == 504:
        return openai_error(
            504,
            message + "; it was not sent to a backend",
            error_type="timeout_error",
            code="deadline_exceeded",
            headers=headers,
            details="tokenweir_deadline",
        )
    return openai_error(
        503,
        message + f"; retry after {shed.retry_after_s}s",
        error_type="server_error",
        code=shed.reason,
        headers=headers,
        details=f"tokenweir_shed_{shed.reason}",
    )


class AdmissionPlugin(BasePlugin):
    name = "admission"
    bounded = True  # its wait is bounded by the lane's max_wait (and the client's deadline)

    def __init__(self, settings: Mapping[str, object], services: Services) -> None:
        unknown = set(settings) - {"tokens_from_length"}
        if unknown:
            raise ConfigError(f"admission: unknown setting(s) {sorted(unknown)}")
        self.tokens_from_length = bool(settings.get("tokens_from_length", True))
        self.services = services
        gates = getattr(services, "gates", None)
        if gates is None:  # no shared gates (a bare Services): this plugin's own
            gates = Gates(clock=services.clock, wall=services.clock)
            gates.configure(services.policy)
        self.gates: Gates = gates
        self.policy = services.policy.admission
        # the batch runners' routes: their lines running are not the ladder's demand
        self.valley_routes = batch_line_routes(services.policy)
        balance = getattr(services, "balance", None)
        if balance is None:  # no shared balance (a bare Services): this plugin's own
            balance = LaneBalance()
            balance.configure(services.policy)
        self.balance: LaneBalance = balance

    async def request_headers(
        self, ctx: Context, headers: Mapping[str, str], end_of_stream: bool
    ) -> Result | None:
        pool = ctx.plan.pool  # the fallback pool when the ladder sent it there
        gate = self.gates.gate(pool) if pool is not None and self.policy.enabled else None
        if gate is None:
            return None
        lane = ctx.lane or ctx.route.lane or "interactive"
        remaining = remaining_seconds(headers, self.gates.wall())
        now = self.gates.clock()
        deadline = now + remaining if remaining is not None else None
        result = await gate.acquire(
            lane,
            ctx.tenant or "anonymous",
            weight=self.policy.weight(ctx.tier),
            tokens=self._tokens(gate, headers),
            deadline=deadline,
            on_wait=ctx.hold,
            key=return_key(ctx.tenant or "anonymous", headers),
            returned=ctx.plan.returned,
            valley=ctx.route.name in self.valley_routes,
        )
        if isinstance(result, Shed):
            result = self.gates.promise(gate.name, result)  # a scale-up may make it sooner
            self.services.metrics.rejected(ctx.route.name, result.reason, result.status)
            return Result(reply=shed_reply(result, lane))
        ctx.put(_HELD, _Held(gate, result))
        set_headers = self._replica(ctx, pool, headers, ranked=gate.core.preemptive)
        if deadline is None:
            return Result(set_headers=set_headers) if set_headers else None
        left_ms = str(max(1, int((deadline - self.gates.clock()) * 1000)))
        set_headers.update({TIMEOUT_HEADER: left_ms, UPSTREAM_TIMEOUT: left_ms})
        return Result(set_headers=set_headers, remove_headers=(DEADLINE_HEADER,))

    def _replica(
        self, ctx: Context, pool: str | None, headers: Mapping[str, str], *, ranked: bool
    ) -> dict[str, str]:
        """The replica header for a ranked pool balanced by lane (else none)."""
        if pool is None or pool not in self.balance.pools:
            return {}
        priority = backend_priority(ctx, self.services.policy)
        if priority is None:
            return {}
        name = self.balance.pick(pool, priority, headers, ranked=ranked)
        if name is None:
            return {}
        ctx.plan.priority, ctx.plan.replica = priority, name
        return {ENDPOINT_HEADER: name}

    def _tokens(self, gate: PoolGate, headers: Mapping[str, str]) -> int:
        if not self.tokens_from_length or gate.core.max_tokens is None:
            return 0
        try:
            return max(0, int(headers.get("content-length", "0"))) // 4
        except ValueError:
            return 0

    async def stream_end(self, ctx: Context) -> None:
        plan = ctx.plan
        if plan.replica is not None and plan.pool is not None and plan.priority is not None:
            self.balance.done(plan.pool, plan.replica, plan.priority)
            plan.replica = None
        held = ctx.take(_HELD)
        if held is not None:
            gate, ticket = held.gate, held.ticket
            # the tokens it was served count against its tenant's share of the lane: its usage;
            # on a route Envoy meters, the access log brings it a moment later (Gates.settled);
            # with no usage at all, what it was expected to cost
            usage = ctx.usage
            if usage is not None:
                settled: float | None = usage.total
            else:
                settled = None if ctx.route.metered_in_envoy else ticket.charge
            gate.release(ticket, settled)
