"""``tokenweir shadow``: primary vs shadow, request by request (docs/operations.md "Shadow traffic").

Reads the pairs the filter servers' shadow recorders wrote to Redis (``runtime.shadow``: one
list per route, newest first) and prints, per route with a ``shadow:`` section, a summary
(errors of each side by kind, latency and TTFT p50/p95, mean output tokens, how many pairs had
the same output tokens, the shadow's latency over the primary's) and the newest pairs. The Redis
is found like ``tokenweir quota`` finds it (``--redis-url``, the running ``tokenweir up``, the
policy's ``ratelimit.redis_url``).
"""

from __future__ import annotations

import argparse
import json
import sys

import redis

from policy import PolicyError, load_policy
from runtime.redis_connect import split_cluster_flag
from runtime.shadow import Pair, Side, decode_pair, pairs_key, summarize
from runtime.statedir import default_state_dir, find_redis
from tokenweir.admin_args import REDIS_FAILURES, add_mesh_redis_args, redis_failure

__all__ = ["format_pairs", "read_pairs", "register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = subparsers.add_parser("shadow", help="primary vs shadow answers, pair by pair")
    add_mesh_redis_args(s)
    s.add_argument("--route", help="only this route")
    s.add_argument("--last", type=int, default=20, help="pairs to list per route (default 20)")
    s.add_argument("--json", action="store_true", help="machine-readable output (every pair)")
    s.set_defaults(func=_main)


def read_pairs(client: redis.Redis, route: str) -> tuple[list[Pair], int]:
    """The stored pairs of ``route``, newest first, and how many entries were unreadable."""
    pairs, bad = [], 0
    for raw in client.lrange(pairs_key(route), 0, -1):
        try:
            pairs.append(decode_pair(raw))
        except ValueError:
            bad += 1
    return pairs, bad


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}ms"


def _side(s: Side) -> str:
    tokens = "-" if s.completion_tokens is None else str(s.completion_tokens)
    return f"{s.status or '-':>3} {_ms(s.ttft_s):>7} {_ms(s.latency_s):>8} {tokens:>5} {s.error or 'ok'}"


def format_pairs(route: str, pairs: list[Pair], last: int) -> str:
    summary = summarize(pairs)
    lines = [f"route {route}: {summary['pairs']} pairs, both ok {summary['both_ok']}, "
             f"same output tokens {summary['same_output_tokens']}, shadow/primary latency p50 "
             f"{summary['latency_ratio_p50'] or 0:.2f}x"]  # fmt: skip
    for name in ("primary", "shadow"):
        f = summary[name]
        kinds = ", ".join(f"{k} {n}" for k, n in f["errors_by_kind"].items()) or "none"
        mean = f["completion_tokens_mean"]
        lines.append(
            f"  {name:<7} errors {f['errors']} ({kinds}); latency p50 {_ms(f['latency_p50_s'])} "
            f"p95 {_ms(f['latency_p95_s'])}; ttft p50 {_ms(f['ttft_p50_s'])} "
            f"p95 {_ms(f['ttft_p95_s'])}; output tokens mean {'-' if mean is None else f'{mean:.1f}'}"
        )
    if pairs and last > 0:
        lines.append(f"  {'request id':<36}  primary: status ttft latency tokens | shadow: same")
        for p in pairs[:last]:
            lines.append(f"  {p.request_id or p.id:<36}  {_side(p.primary)} | {_side(p.shadow)}")
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.config)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 2
    routes = sorted(
        r.name for gw in policy.gateways.values() for r in gw.routes if r.shadow is not None
    )
    if args.route is not None:
        if args.route not in routes:
            print(
                f"route {args.route!r} has no shadow section; shadowed: {routes}", file=sys.stderr
            )
            return 2
        routes = [args.route]
    if not routes:
        print("no route mirrors to a shadow pool")
        return 0
    policy_url = policy.ratelimit.redis_url if policy.ratelimit else None
    target = find_redis(
        args.redis_url, args.state_dir or default_state_dir(args.config), policy_url
    )
    client = redis.Redis.from_url(split_cluster_flag(target.url)[0], socket_connect_timeout=2)
    try:
        found = {r: read_pairs(client, r) for r in routes}
    except REDIS_FAILURES as exc:
        print(redis_failure(target, exc), file=sys.stderr)
        return 1
    finally:
        client.close()
    if args.json:
        out = {r: {"summary": summarize(p), "unreadable": bad,
                   "pairs": [json.loads(x.encode()) for x in p]}
               for r, (p, bad) in found.items()}  # fmt: skip
        json.dump({"routes": out}, sys.stdout, indent=2, sort_keys=True)
        print()
        return 0
    print("\n".join(format_pairs(r, p, args.last) for r, (p, _) in found.items()))
    return 0
