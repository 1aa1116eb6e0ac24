"""tokens: parse the body, bound the prompt, set max_tokens and the reservation.

**The prompt** (:func:`estimate_prompt`) is counted with the filter server's tokenizer file, or
bounded from its UTF-8 bytes (:class:`filters.estimate.ByteBound`), plus what a chat template
may add (``_TEMPLATE_TOKENS`` per request, ``_PER_MESSAGE`` per message, the ``tools``): never
less than the backend will count, whatever the client sends.

**The reservation** ``x-tokenweir-reserve`` = the prompt + the output the request is likely to
use (policy ``reservation``): with ``output: learned`` the tenant's (else the model's pooled)
``quantile`` of settled completion tokens (:mod:`filters.output_lengths`, fed by this plugin's
``stream_end`` from the usage the usage plugin read), never above ``max_tokens``; else
``max_tokens`` itself.

**max_tokens** ≤ the tier's ``max_tokens`` and a degradation step's cap. With
``reservation.short_budget: clamp`` also ≤ what the tenant's token budget still holds after the
prompt (never below 1: an empty budget is the rate-limit service's to refuse). With ``reject``
(the default) the budget is not read here: a request whose reservation does not fit gets the
rate-limit service's 429 with ``Retry-After``, and an admitted one keeps its ``max_tokens`` (its
answer is whole). The body is rewritten when the value changes or is absent, and streamed
chat/completions get ``stream_options.include_usage`` so the usage plugin can settle. Where the
pool schedules by priority (``pools.NAME.priority_scheduling``), the body carries the lane's
``priority`` (``admission.LANE.priority``, negated for ``low_values_first``); a ``priority``
the client sent is replaced, or removed where the pool does not schedule by it: the gateway,
not the client, ranks requests.

Settings: ``extra_fields`` (body fields to accept besides the known ones), ``reject_unknown``
(default true), ``default_max_tokens`` (cap when the tenant has no tier; default 4096),
``max_body_bytes`` (default: the route's), ``budget_timeout`` (default 50 ms: a slower budget
read is skipped and the tier cap alone applies; ``clamp`` only).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping

from chat.tokenizer import ChatTemplateError
from filters.api import BasePlugin, Context, Result
from filters.bodies import (
    Kind,
    LlmRequest,
    body_json,
    check_request,
    empty_body,
    kind_for_path,
    write_body,
)
from filters.errors import ClientError, ConfigError
from filters.plugins.admission.limits import preemptive
from filters.plugins.lora.names import adapter_model
from filters.services import Services
from filters.settings import float_setting, int_setting, optional_int_setting, strings_setting
from policy.model import Policy
from runtime.throttled_log import ThrottledLog
from wire.contract import MODEL_HEADER, RESERVE_HEADER

__all__ = ["EXACT_BYTES", "TokensPlugin", "backend_priority", "estimate_prompt"]

_log = logging.getLogger(__name__)
_PER_MESSAGE = 4  # special tokens a chat template adds per message beyond the rendered text's
# what a template adds per request: BOS, the assistant header, a default system prompt (Qwen's
# is 16 tokens); the rendered text already holds each role name and two separators per message
_TEMPLATE_TOKENS = 64
EXACT_BYTES = 16 * 1024  # rendered prompts counted exactly with the pool's tokenizer, at most


def estimate_prompt(req: LlmRequest, services: Services) -> int:
    """The prompt's tokens: exact for token ids, else the estimator's count (an upper bound with
    :class:`~filters.estimate.ByteBound`) plus what a template may add."""
    if req.input_ids is not None:
        return len(req.input_ids)
    count = services.estimator.count
    n = count(req.prompt_text)
    if req.kind == "chat":
        messages = req.data.get("messages")  # a non-empty list: parse_request checked it
        n += _PER_MESSAGE * (len(messages) if isinstance(messages, list) else 0) + _TEMPLATE_TOKENS
        tools = req.data.get("tools")
        if tools:  # the template writes the tool definitions into the prompt
            n += count(json.dumps(tools, ensure_ascii=False))
    elif req.kind == "embedding":  # a BOS per item
        items = req.data.get("input")
        n += len(items) if isinstance(items, list) else 1
    else:
        n += 1  # BOS
    return max(1, n)


def backend_priority(ctx: Context, policy: Policy) -> int | None:
    """The ``priority`` this request carries to its pool's backends: its lane's, where the
    pool schedules by priority; None elsewhere."""
    pool = ctx.plan.pool
    if pool is None or pool not in policy.pools or not preemptive(policy, pool):
        return None
    value: int = policy.admission.priority(ctx.lane or ctx.route.lane or "interactive")
    low_first = policy.pools[pool].priority_scheduling.low_values_first
    return -value if low_first else value


def _too_large(size: int, limit: int) -> ClientError:
    return ClientError(
        413,
        f"the request body has {size} bytes; this route accepts at most {limit}",
        reason="too_large",
    )


def _set_max_tokens(req: LlmRequest, value: int) -> None:
    if req.kind == "generate":
        params = req.data.get("sampling_params")
        if not isinstance(params, dict):
            params = req.data["sampling_params"] = {}
        params["max_new_tokens"] = value
    else:
        req.data[req.max_tokens_field] = value
        other = _other_field(req)
        if req.data.get(other) is not None:  # both given: clamp both
            req.data[other] = value


def _other_field(req: LlmRequest) -> str:
    return (
        "max_tokens" if req.max_tokens_field == "max_completion_tokens" else "max_completion_tokens"
    )


class TokensPlugin(BasePlugin):
    name = "tokens"
    bounded = True  # Redis reads have their own timeouts

    def __init__(self, settings: Mapping[str, object], services: Services) -> None:
        unknown = set(settings) - {
            "extra_fields",
            "reject_unknown",
            "default_max_tokens",
            "max_body_bytes",
            "budget_timeout",
        }
        if unknown:
            raise ConfigError(f"tokens: unknown setting(s) {sorted(unknown)}")
        self.extra_fields = strings_setting(settings, "tokens", "extra_fields")
        self.reject_unknown = bool(settings.get("reject_unknown", True))
        self.default_max_tokens = int_setting(settings, "tokens", "default_max_tokens", 4096)
        self.max_body_bytes = optional_int_setting(settings, "tokens", "max_body_bytes")
        self.budget_timeout = float_setting(settings, "tokens", "budget_timeout", 0.05)
        self.services = services
        self._budget_warn = ThrottledLog(services.clock, 10.0, _log)  # not one line per request

    def _limit(self, ctx: Context) -> int:
        return self.max_body_bytes or ctx.route.max_body_bytes

    async def request_headers(
        self, ctx: Context, headers: Mapping[str, str], end_of_stream: bool
    ) -> Result | None:
        kind = kind_for_path(ctx.path)
        if kind is None or ctx.method not in ("POST", "PUT"):
            return None
        if end_of_stream:  # no body at all: Envoy would skip the body phase
            raise empty_body()
        ctype = headers.get("content-type", "application/json").split(";", 1)[0].strip().lower()
        if ctype != "application/json":
            raise ClientError(
                415,
                f"Content-Type must be application/json, got {ctype!r}",
                reason="content_type",
            )
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self._limit(ctx):
            raise _too_large(int(length), self._limit(ctx))
        return None

    async def request_body(self, ctx: Context, body: bytes) -> Result | None:
        if len(body) > self._limit(ctx):
            raise _too_large(len(body), self._limit(ctx))
        kind: Kind | None = kind_for_path(ctx.path)
        if kind is None:
            return None
        req = check_request(
            kind,
            body_json(ctx, body),
            extra_fields=self.extra_fields,
            reject_unknown=self.reject_unknown,
        )
        ctx.body = req
        model = req.model or (ctx.route.models[0] if ctx.route.models else "unknown")
        pool = self.services.policy.pools.get(ctx.route.pool) if ctx.route.pool else None
        model = adapter_model(pool, model)  # "base:adapter" on a LoRA pool (filters/plugins/lora)
        if not self._model_served(ctx, model):
            raise ClientError(
                404,
                f"The model {model!r} does not exist or you do not have access to it.",
                reason="model_not_found",
                param="model",
                code="model_not_found",
            )
        ctx.model = model
        ctx.stream = req.stream
        ctx.client_wants_usage = req.include_usage
        prompt = self._exact_prompt(ctx, req)
        if prompt is None:
            prompt = estimate_prompt(req, self.services)
        ctx.prompt_tokens = prompt
        embedding = kind == "embedding"  # generates nothing: its cost is its prompt
        final, why = (0, "none") if embedding else await self._clamp(ctx, req, prompt, model)
        ctx.max_tokens = final
        ctx.reserve = prompt + (0 if embedding else self._output_reserve(ctx, model, final))
        if ctx.tenant is not None and ctx.route.rate_limited:
            self.services.budget.note_reserved(ctx.tenant, model, ctx.lane, ctx.reserve)
        rewrite = not embedding and (
            final != req.max_tokens
            or (kind != "generate" and req.data.get(_other_field(req)) not in (None, final))
        )
        if rewrite:
            _set_max_tokens(req, final)
            if ctx.tenant is not None:
                m = self.services.metrics
                m.clamped.labels(m.tenant_label(ctx.tenant), why).inc()
        fallback = ctx.plan.model  # the degradation ladder sends it to the fallback pool
        if fallback is not None and kind != "generate" and req.data.get("model") != fallback:
            req.data["model"] = fallback
            rewrite = True
        priority = backend_priority(ctx, self.services.policy)
        if req.data.get("priority", None) != priority:
            if priority is None:
                del req.data["priority"]
            else:
                req.data["priority"] = priority
            rewrite = True
        if req.stream and kind != "generate" and not req.include_usage:
            opts = req.data.get("stream_options")
            # an object or absent (parse_request checked it)
            req.data["stream_options"] = {
                **(opts if isinstance(opts, dict) else {}),
                "include_usage": True,
            }
            rewrite = True
        headers = {MODEL_HEADER: model, RESERVE_HEADER: str(ctx.reserve)}
        if not rewrite:
            return Result(set_headers=headers)
        new = write_body(ctx, req.data)
        headers["content-length"] = str(len(new))
        return Result(set_headers=headers, body=new)

    def _exact_prompt(self, ctx: Context, req: LlmRequest) -> int | None:
        """The prompt's exact token count where the pool names its model's tokenizer
        (``routing.tokenizer``, loaded by the pool's endpoint picker): rendered with the
        model's chat template as the backend renders it, and tokenized, for rendered prompts
        up to ``EXACT_BYTES`` (past that, the byte bound: tokenizing costs about a microsecond
        a byte, docs/quotas.md); None where there is no such tokenizer or the template refuses
        the request (the byte bound then)."""
        pickers = self.services.pickers
        picker = pickers.get(ctx.route.pool) if pickers is not None else None
        if picker is None or picker.model is None or req.input_ids is not None:
            return None
        model = picker.model
        data = picker.render(req.kind, req.data)
        if data is None or len(data) > EXACT_BYTES:
            return None
        try:
            n = len(model.encode(data.decode("utf-8", "surrogatepass")))
        except ChatTemplateError:
            return None
        ctx.rendered = data
        return max(1, n)

    def _output_reserve(self, ctx: Context, model: str, max_tokens: int) -> int:
        """The output tokens to reserve: the learned quantile (policy ``reservation``), at most
        ``max_tokens``; ``max_tokens`` where nothing is learned yet or the policy asks, and on a
        route whose usage plugin does not stop streams at the budget: an answer longer than its
        reservation would overshoot the budget there (docs/quotas.md)."""
        policy = self.services.policy.reservation
        lengths = self.services.lengths
        if policy.output != "learned" or lengths is None or ctx.tenant is None:
            return max_tokens
        if not ctx.route.stops_at_budget:
            self.services.metrics.reservations.labels("no_stop").inc()
            return max_tokens
        learned, source = lengths.quantile(ctx.tenant, model, policy.quantile, policy.min_samples)
        if source == "none" or learned >= max_tokens:
            self.services.metrics.reservations.labels("max_tokens").inc()
            return max_tokens
        self.services.metrics.reservations.labels(source).inc()
        return max(1, learned)

    async def stream_end(self, ctx: Context) -> None:
        """Learn the settled answer's length where the Python usage plugin read it (where
        Envoy's usage meter reads it, the access log feeds the same model: filters/usage_log.py)."""
        u, lengths = ctx.usage, self.services.lengths
        if u is None or lengths is None or ctx.tenant is None or ctx.model is None:
            return
        lengths.observe(ctx.tenant, ctx.model, u.completion_tokens)

    def _model_served(self, ctx: Context, model: str) -> bool:
        """The route's pool serves it, or a route matches on it (Envoy re-routes by model; to a
        metered route only from a metered one).

        Else the request would be served by this pool under a model name no quota or metric
        knows: ``models.<name>`` quotas would not apply, and every new name is a new label."""
        if not ctx.route.models or model in ctx.route.models:
            return True
        gateways = getattr(self.services.policy, "gateways", {})
        routes = [r for g in gateways.values() for r in g.routes if r.match.model == model]
        # Envoy keeps the filters of the first route match: an unmetered route has no rate-limit
        # filter, so it must not hand a request on to a metered one
        metered = any(r.rate_limit is not None and r.rate_limit.enabled for r in routes)
        return bool(routes) and (ctx.route.rate_limited or not metered)

    async def _clamp(
        self, ctx: Context, req: LlmRequest, prompt: int, model: str
    ) -> tuple[int, str]:
        tier = self.services.policy.tiers.get(ctx.tier) if ctx.tier else None
        cap = tier.max_tokens if tier is not None else self.default_max_tokens
        why = "tier"
        clamp = self.services.policy.reservation.short_budget == "clamp"
        if clamp and ctx.tenant is not None and ctx.route.rate_limited:
            budget = self.services.budget
            known, left = budget.cached(ctx.tenant, model, ctx.lane)  # a hit: no timer, no task
            if not known:
                try:
                    async with asyncio.timeout(self.budget_timeout):
                        left = await budget.remaining(ctx.tenant, model, ctx.lane)
                except Exception as exc:  # slow or down: the rate-limit service still decides
                    self._budget_warn.warning(
                        "budget lookup failed for %s (%s); using the tier cap",
                        ctx.tenant,
                        repr(exc),
                    )
                    self.services.metrics.redis_errors.inc()
                    left = None
            if left is not None and left - prompt < cap:
                cap, why = max(1, left - prompt), "budget"
        ladder = ctx.plan.max_tokens_cap  # a degradation step's lower cap
        if ladder is not None and ladder < cap:
            cap, why = ladder, "degraded"
        if req.max_tokens is None:
            return cap, "absent"
        return min(req.max_tokens, cap), why
