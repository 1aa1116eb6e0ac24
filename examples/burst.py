"""Send a burst of streaming chat completions from the example's two demo tenants at once and
say what each got: the pro tenant's interactive requests against the free tenant's batch ones.

    .venv/bin/python examples/burst.py --pro 40 --free 8

Every request streams (``stream: true``); a 200 is timed to its first token, any other answer
is shown with its ``Retry-After`` and the error ``code`` of its OpenAI-style body, and answers
the degradation ladder changed show its ``x-tokenweir-degraded`` and the model that answered.
README.md ("Overload") walks through it against ``make up``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass

import aiohttp

KEYS = {"pro": "tw-demo-pro-key", "free": "tw-demo-free-key"}


@dataclass(frozen=True)
class Outcome:
    tenant: str  # pro | free
    status: int
    seconds: float  # to the first token (200) or to the answer (any other status)
    retry_after: str | None
    code: str | None  # the error body's code (non-200)
    degraded: str | None  # x-tokenweir-degraded
    model: str | None  # x-tokenweir-served-model


def _code(text: str) -> str | None:
    try:
        err = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return None
    return str(err.get("code")) if isinstance(err, dict) else None


async def one(s: aiohttp.ClientSession, url: str, tenant: str, i: int, max_tokens: int) -> Outcome:
    body = {
        "model": "llama-3.1-8b",
        "messages": [{"role": "user", "content": f"Tell story {i} about a weir, slowly."}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    started = time.monotonic()
    headers = {"authorization": f"Bearer {KEYS[tenant]}"}
    async with s.post(url, json=body, headers=headers) as r:
        code = None
        if r.status == 200:
            await r.content.readline()  # the first event
            took = time.monotonic() - started
            async for _ in r.content:  # the rest of the stream
                pass
        else:
            code = _code(await r.text())
            took = time.monotonic() - started
        h = r.headers
        return Outcome(
            tenant, r.status, took, h.get("retry-after"), code,
            h.get("x-tokenweir-degraded"), h.get("x-tokenweir-served-model"),
        )  # fmt: skip


async def burst(url: str, pro: int, free: int, max_tokens: int = 200) -> list[Outcome]:
    """``pro`` + ``free`` requests sent together; their outcomes (pro first)."""
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        calls = [one(s, url, "pro", i, max_tokens) for i in range(pro)]
        calls += [one(s, url, "free", i, max_tokens) for i in range(free)]
        return list(await asyncio.gather(*calls))


def _answer_order(item: tuple[tuple[int, str, str | None], int]) -> tuple[int, str, float]:
    (status, code, after), _ = item
    try:
        return status, code, float(after) if after is not None else -1.0
    except ValueError:
        return status, code, -1.0


def report(outcomes: list[Outcome]) -> str:
    lines = []
    for tenant in KEYS:
        mine = [o for o in outcomes if o.tenant == tenant]
        if not mine:
            continue
        ok = sorted(o.seconds for o in mine if o.status == 200)
        line = f"{tenant}: {len(ok)} of {len(mine)} streamed"
        if ok:
            line += (
                f", first token p50 {ok[len(ok) // 2] * 1000:.0f} ms, max {ok[-1] * 1000:.0f} ms"
            )
        lines.append(line)
        answers = Counter((o.status, o.code or "", o.retry_after) for o in mine if o.status != 200)
        for (status, code, after), n in sorted(answers.items(), key=_answer_order):
            lines.append(f"  {n} x {status} {code} Retry-After: {after}")
        degraded_ok = Counter((o.degraded, o.model) for o in mine if o.status == 200 and o.degraded)
        for (degraded, model), n in degraded_ok.items():
            lines.append(f"  {n} streamed degraded ({degraded}) by {model}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:10000/v1/chat/completions")
    p.add_argument("--pro", type=int, default=40, help="interactive requests (tenant demo-pro)")
    p.add_argument("--free", type=int, default=8, help="batch requests (tenant demo-free)")
    p.add_argument("--max-tokens", type=int, default=200)
    a = p.parse_args()
    print(report(asyncio.run(burst(a.url, a.pro, a.free, a.max_tokens))))


if __name__ == "__main__":
    main()
