"""Run a route's plugins for one phase, merge what they ask for, isolate their failures.

The chain is protocol-free: :mod:`filters.server` turns its :class:`Outcome` into ext_proc
messages. A plugin that raises :class:`~filters.errors.ClientError` ends the request with that
4xx; any other exception (or running past the request deadline) is a plugin failure: counted,
then skipped when the route fails open, or answered with a clear 500/504 when it fails closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from filters.api import HOOKS, BasePlugin, Context, Hook, Plugin, Reply, Result, openai_error
from filters.errors import ClientError
from wire.jsontypes import JsonValue

__all__ = ["Chain", "ChainEvents", "Outcome", "error_reply"]

_log = logging.getLogger(__name__)


class ChainEvents(Protocol):
    """Where the chain reports what happened (filters.metrics.FilterMetrics implements it)."""

    def rejected(self, route: str, reason: str, status: int) -> None: ...

    def plugin_failed(self, route: str, plugin: str, phase: str) -> None: ...


@dataclass(slots=True)
class Outcome:
    """The merged result of one phase."""

    set_headers: dict[str, str] = field(default_factory=dict)
    remove_headers: list[str] = field(default_factory=list)
    body: bytes | None = None
    metadata: dict[str, JsonValue] = field(default_factory=dict)
    reply: Reply | None = None
    clear_route_cache: bool = False

    def merge(self, r: Result) -> None:
        for name in r.remove_headers:
            self.set_headers.pop(name, None)
            self.remove_headers.append(name)
        self.set_headers.update(r.set_headers)
        if r.body is not None:
            self.body = r.body
        self.metadata.update(r.metadata)
        self.clear_route_cache |= r.clear_route_cache
        if r.reply is not None:
            self.reply = r.reply

    @property
    def empty(self) -> bool:
        return not (
            self.set_headers
            or self.remove_headers
            or self.body is not None
            or self.metadata
            or self.reply
            or self.clear_route_cache
        )


def error_reply(exc: ClientError) -> Reply:
    """The one place a :class:`ClientError` becomes an HTTP answer."""
    return openai_error(
        exc.status,
        exc.message,
        error_type=exc.error_type,
        param=exc.param,
        code=exc.code,
        headers=dict(exc.headers),
        details=f"tokenweir_{exc.reason}",
    )


def _hooks_of(plugin: Plugin) -> frozenset[Hook]:
    if isinstance(plugin, BasePlugin):
        return type(plugin).hooks()
    return frozenset(HOOKS)


class Chain:
    """The plugins of one route, in order, with the route's failure mode and request deadline."""

    def __init__(
        self,
        route: str,
        plugins: Sequence[Plugin],
        *,
        failure_mode: Literal["open", "closed"] = "closed",
        deadline: float = 0.15,
        events: ChainEvents | None = None,
    ) -> None:
        self.route = route
        self.plugins = tuple(plugins)
        self.failure_mode = failure_mode
        self.deadline = deadline
        self.events = events
        by_hook = {h: tuple(p for p in self.plugins if h in _hooks_of(p)) for h in HOOKS}
        self._by_hook: Mapping[Hook, tuple[Plugin, ...]] = by_hook
        self._unbounded: frozenset[Hook] = frozenset(
            h for h, ps in by_hook.items() if any(not getattr(p, "bounded", False) for p in ps)
        )
        self.hooks: frozenset[Hook] = frozenset(h for h, ps in by_hook.items() if ps)

    def needs(self, hook: Hook) -> bool:
        return hook in self.hooks

    async def request_headers(
        self, ctx: Context, headers: dict[str, str], end_of_stream: bool
    ) -> Outcome:
        async def call(p: Plugin) -> Result | None:
            return await p.request_headers(ctx, headers, end_of_stream)

        timed = "request_headers" in self._unbounded
        return await self._run("request_headers", ctx, call, headers=headers, timed=timed)

    async def request_body(self, ctx: Context, body: bytes) -> Outcome:
        state = {"body": body}

        async def call(p: Plugin) -> Result | None:
            return await p.request_body(ctx, state["body"])

        timed = "request_body" in self._unbounded
        try:
            return await self._run("request_body", ctx, call, body_state=state, timed=timed)
        finally:  # the body's bytes are read in this phase only: not kept to the stream's end
            ctx.decoded = None

    async def response_headers(self, ctx: Context, headers: dict[str, str]) -> Outcome:
        async def call(p: Plugin) -> Result | None:
            return await p.response_headers(ctx, headers)

        return await self._run("response_headers", ctx, call, headers=headers, timed=False)

    async def response_chunk(self, ctx: Context, chunk: bytes, end_of_stream: bool) -> Outcome:
        state = {"body": chunk}

        async def call(p: Plugin) -> Result | None:
            return await p.response_chunk(ctx, state["body"], end_of_stream)

        return await self._run("response_chunk", ctx, call, body_state=state, timed=False)

    async def stream_end(self, ctx: Context) -> None:
        for p in self._by_hook["stream_end"]:
            try:
                await p.stream_end(ctx)
            except Exception:
                _log.exception("plugin %s failed at stream end", getattr(p, "name", p))
                if self.events is not None:
                    self.events.plugin_failed(self.route, getattr(p, "name", "?"), "stream_end")

    async def _run(
        self,
        phase: Hook,
        ctx: Context,
        call: Callable[[Plugin], Awaitable[Result | None]],
        *,
        headers: dict[str, str] | None = None,
        body_state: dict[str, bytes] | None = None,
        timed: bool,
    ) -> Outcome:
        out = Outcome()
        plugins = self._by_hook[phase]
        if not plugins:
            return out
        if not timed:
            await self._each(phase, plugins, call, out, headers, body_state, [])
            return out
        running: list[Plugin] = []
        try:
            async with asyncio.timeout(self.deadline):
                await self._each(phase, plugins, call, out, headers, body_state, running)
        except TimeoutError as exc:  # one deadline for the whole phase, blamed on the plugin in it
            failed = self._failed(running[-1], phase, exc)
            if failed is not None:
                out.reply = failed
        return out

    async def _each(
        self,
        phase: Hook,
        plugins: tuple[Plugin, ...],
        call: Callable[[Plugin], Awaitable[Result | None]],
        out: Outcome,
        headers: dict[str, str] | None,
        body_state: dict[str, bytes] | None,
        running: list[Plugin],
    ) -> None:
        for p in plugins:
            running.append(p)
            try:
                r = await call(p)
            except ClientError as exc:
                if self.events is not None:
                    self.events.rejected(self.route, exc.reason, exc.status)
                out.reply = error_reply(exc)
                return
            except Exception as exc:
                failed = self._failed(p, phase, exc)
                if failed is not None:
                    out.reply = failed
                    return
                continue
            if r is None:
                continue
            out.merge(r)
            if r.reply is not None:
                return
            if headers is not None:
                for name in r.remove_headers:
                    headers.pop(name, None)
                headers.update(r.set_headers)
            if body_state is not None and r.body is not None:
                body_state["body"] = r.body

    def _failed(self, plugin: Plugin, phase: str, exc: Exception) -> Reply | None:
        name = getattr(plugin, "name", type(plugin).__name__)
        timeout = isinstance(exc, TimeoutError)
        _log.error(
            "plugin %s %s in %s on route %s: %r",
            name,
            "timed out" if timeout else "failed",
            phase,
            self.route,
            exc,
        )
        if self.events is not None:
            self.events.plugin_failed(self.route, name, phase)
        if self.failure_mode == "open":
            return None
        status = 504 if timeout else 500
        what = "did not answer in time" if timeout else "failed"
        return openai_error(
            status,
            f"the gateway's {name!r} plugin {what}; the request was not sent upstream",
            error_type="server_error",
            details=f"tokenweir_plugin_{'timeout' if timeout else 'error'}",
        )
