"""gRPC load for the rate-limit service: ``concurrency`` callers for ``seconds`` (closed loop), or
with ``--rate R`` an open loop: a call every 1/R s whatever the answers, at most ``concurrency`` in
flight (a call that would exceed it counts as ``dropped``); latency is then measured from the
call's scheduled time, so a client that falls behind shows as latency, not as fewer calls.

Requests are pre-serialized (Envoy-shaped reserve descriptors, distinct request ids) and sent as
raw bytes so the client spends as little CPU as possible. ``--client h2`` (the default) sends
them through :mod:`h2_grpc_client` (pre-encoded frames, ~10x less CPU per call than grpc.aio
here); ``--client grpc`` through grpc.aio, for comparison. Prints one JSON line:
{"calls", "seconds", "rps", "p50_ms", "p99_ms", "errors", "over_limit"}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import grpc

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from h2_grpc_client import GrpcError, H2GrpcClient  # noqa: E402

from tests.ratelimit_service import rls  # noqa: E402

METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"


Caller = Any  # (payload: bytes, timeout=...) -> Awaitable[bytes]
FAILED: tuple[type[Exception], ...] = (grpc.aio.AioRpcError, GrpcError)


async def _callers(target: str, n: int, client: str) -> tuple[list[Caller], Any]:
    """``n`` connections' call functions, and a coroutine function that closes them."""
    if client == "h2":
        host, _, port = target.rpartition(":")
        conns = [await H2GrpcClient.connect(host, int(port), METHOD) for _ in range(n)]

        def caller(c: H2GrpcClient) -> Caller:
            async def call(payload: bytes, timeout: float = 5.0) -> bytes:
                return await asyncio.wait_for(c.call(payload), timeout)

            return call

        async def close_h2() -> None:
            for c in conns:
                c.close()

        return [caller(c) for c in conns], close_h2
    opts = [("grpc.use_local_subchannel_pool", 1)]  # one TCP connection per channel
    channels = [grpc.aio.insecure_channel(target, options=opts) for _ in range(n)]

    async def close_grpc() -> None:
        for c in channels:
            await c.close(None)

    calls = [
        c.unary_unary(METHOD, request_serializer=None, response_deserializer=None) for c in channels
    ]
    return calls, close_grpc


async def run(
    target: str,
    concurrency: int,
    seconds: float,
    tenants: int,
    rate: float = 0.0,
    client: str = "h2",
    connections: int = 0,
) -> dict[str, Any]:
    payloads = [
        rls.llm(
            f"bench-{i % tenants}", 50 + i % 200, rid=f"{time.time_ns()}-{i}"
        ).SerializeToString()
        for i in range(20_000)
    ]
    conns = connections or max(1, min(4, concurrency // 25))
    calls, close = await _callers(target, conns, client)
    lat: list[float] = []
    errors = over = 0
    stop = time.perf_counter() + seconds
    start = time.perf_counter()

    async def worker(w: int) -> None:
        nonlocal errors, over
        call = calls[w % len(calls)]
        i = w * 997
        while True:
            t0 = time.perf_counter()
            if t0 >= stop:
                return
            i += 1
            try:
                resp = await call(payloads[i % len(payloads)], timeout=5)
            except FAILED:
                errors += 1
                continue
            lat.append(time.perf_counter() - t0)
            if resp[:2] == b"\x08\x02":  # overall_code = OVER_LIMIT
                over += 1

    dropped = 0

    async def one(i: int, due: float) -> None:
        nonlocal errors, over
        try:
            resp = await calls[i % len(calls)](payloads[i % len(payloads)], timeout=5)
        except FAILED:
            errors += 1
            return
        lat.append(time.perf_counter() - due)
        if resp[:2] == b"\x08\x02":
            over += 1

    async def open_loop() -> None:
        nonlocal dropped
        pending: set[asyncio.Task[None]] = set()
        i = 0
        while True:
            due = start + i / rate
            if due >= stop:
                break
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(pending) >= concurrency:
                dropped += 1
            else:
                task = asyncio.create_task(one(i, due))
                pending.add(task)
                task.add_done_callback(pending.discard)
            i += 1
        if pending:
            await asyncio.gather(*pending)

    if rate > 0:
        await open_loop()
    else:
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    elapsed = time.perf_counter() - start
    await close()
    lat.sort()
    n = len(lat)
    return {
        "calls": n,
        "seconds": round(elapsed, 3),
        "rps": round(n / elapsed, 1),
        "p50_ms": round(lat[n // 2] * 1e3, 3) if n else 0.0,
        "p99_ms": round(lat[int(n * 0.99)] * 1e3, 3) if n else 0.0,
        "errors": errors,
        "over_limit": over,
        "offered_rps": rate,
        "dropped": dropped,
        "client": client,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--tenants", type=int, default=100)
    p.add_argument("--rate", type=float, default=0.0, help="open loop: calls per second")
    p.add_argument("--client", choices=("h2", "grpc"), default="h2")
    p.add_argument(
        "--connections", type=int, default=0,
        help="connections to open (default: one per 25 callers, at most 4); a service of N "
        "processes on one port (SO_REUSEPORT) needs several per process to load them all",
    )  # fmt: skip
    a = p.parse_args()
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        print(
            json.dumps(
                runner.run(
                    run(
                        a.target,
                        a.concurrency,
                        a.seconds,
                        a.tenants,
                        a.rate,
                        a.client,
                        a.connections,
                    )
                )
            )
        )


if __name__ == "__main__":
    main()
