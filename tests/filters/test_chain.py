from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping

from filters.api import BasePlugin, Context, Result
from filters.chain import Chain
from filters.errors import ClientError
from filters.metrics import FilterMetrics
from tests.filters.conftest import make_ctx


class SetHeader(BasePlugin):
    name = "set"

    async def request_headers(
        self, ctx: Context, headers: Mapping[str, str], end_of_stream: bool
    ) -> Result | None:
        return Result(set_headers={"x-a": "1"})


class Boom(BasePlugin):
    name = "boom"

    async def request_headers(
        self, ctx: Context, headers: Mapping[str, str], end_of_stream: bool
    ) -> Result | None:
        raise RuntimeError("bug")


class Slow(BasePlugin):
    name = "slow"
    delay = 10.0

    async def request_body(self, ctx: Context, body: bytes) -> Result | None:
        await asyncio.sleep(self.delay)
        return None


class Upper(BasePlugin):
    name = "upper"

    async def request_body(self, ctx: Context, body: bytes) -> Result | None:
        return Result(body=body.upper())


class Reject(BasePlugin):
    name = "reject"

    async def request_body(self, ctx: Context, body: bytes) -> Result | None:
        raise ClientError(400, "no", reason="bad_json")


def test_hooks_are_detected() -> None:
    chain = Chain("r", [SetHeader(), Upper()])
    assert chain.hooks == {"request_headers", "request_body"}


async def test_failing_plugin_open_continues_closed_answers_500() -> None:
    m = FilterMetrics()
    open_chain = Chain("r", [Boom(), SetHeader()], failure_mode="open", events=m)
    out = await open_chain.request_headers(make_ctx(), {}, False)
    assert out.reply is None and out.set_headers == {"x-a": "1"}
    closed = Chain("r", [Boom(), SetHeader()], failure_mode="closed", events=m)
    out = await closed.request_headers(make_ctx(), {}, False)
    assert out.reply is not None and out.reply.status == 500
    assert json.loads(out.reply.body)["error"]["type"] == "server_error"
    assert (
        m.registry.get_sample_value(
            "tokenweir_filters_plugin_errors_total",
            {"route": "r", "plugin": "boom", "phase": "request_headers"},
        )
        == 2
    )


async def test_slow_plugin_hits_the_deadline() -> None:
    chain = Chain("r", [Slow()], failure_mode="closed", deadline=0.05)
    out = await chain.request_body(make_ctx(), b"{}")
    assert out.reply is not None and out.reply.status == 504


async def test_body_replacements_chain_and_client_errors_stop() -> None:
    chain = Chain("r", [Upper(), Upper()])
    out = await chain.request_body(make_ctx(), b"abc")
    assert out.body == b"ABC"
    m = FilterMetrics()
    out = await Chain("r", [Reject(), Upper()], events=m).request_body(make_ctx(), b"x")
    assert out.reply is not None and out.reply.status == 400 and out.body is None
    assert (
        m.registry.get_sample_value(
            "tokenweir_filters_rejections_total",
            {"route": "r", "reason": "bad_json", "status": "400"},
        )
        == 1
    )


class SlowBounded(Slow):
    name = "slow-bounded"
    bounded = True


async def test_phases_of_bounded_plugins_skip_the_deadline() -> None:
    chain = Chain("r", [SlowBounded()], failure_mode="closed", deadline=0.01)
    assert chain._unbounded == frozenset()
    SlowBounded.delay = 0.05
    out = await chain.request_body(make_ctx(), b"{}")
    assert out.reply is None  # not cut: bounded plugins promise their own timeouts
    assert Chain("r", [SlowBounded(), Slow()])._unbounded == {"request_body"}
