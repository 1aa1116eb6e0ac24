"""Where each request's TTFT went (bench/routing.py): the client's timings joined with the
backends' own request logs (the emulator's ``--request-log``) by the answer's ``id``.

For every request answered: the client's TTFT, the backend's (arrival at the replica → first
token; of it ``queue`` until the replica admitted it to a batch), and what is left, the
``gateway`` share (the router's queueing and CPU, the hops, the body's transfer). Summaries: the
percentiles of each part over all requests, and the mean parts of the slowest 1% and 5% by the
client's TTFT: is the tail made at the backends (routing: a long prefill in front, no cache) or
in the gateway? The slowest few are kept whole for a post-mortem.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["read_logs", "split", "split_line"]

_KEEP = 12  # the slowest requests kept whole


def read_logs(paths: Iterable[Path]) -> dict[str, dict[str, Any]]:
    """rid → the backend's line, with ``replica`` (the log's position in ``paths``) added."""
    out: dict[str, dict[str, Any]] = {}
    for n, path in enumerate(paths):
        if not path.exists():
            continue
        for raw in path.read_text().splitlines():
            line = json.loads(raw)
            line["replica"] = n
            out[line["rid"]] = line
    return out


def _pcts(xs: Sequence[float]) -> dict[str, float]:
    if len(xs) < 2:
        return {}
    q = statistics.quantiles(xs, n=100)
    return {
        "p50_ms": 1000 * statistics.median(xs),
        "p95_ms": 1000 * q[94],
        "p99_ms": 1000 * q[98],
        "mean_ms": 1000 * statistics.fmean(xs),
    }


def split(
    per_request: Sequence[Sequence[Any]], backend: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """``per_request``: (job, sent s, client TTFT s or None, answer id) per request."""
    rows = []
    for job, sent, ttft, rid in per_request:
        line = backend.get(rid) if rid is not None else None
        if ttft is None or line is None or line.get("ttft_s") is None:
            continue
        rows.append(
            {
                "job": job,
                "sent_s": round(sent, 4),
                "replica": line["replica"],
                "client_ms": 1000 * ttft,
                "backend_ms": 1000 * line["ttft_s"],
                "queue_ms": 1000 * (line["queue_s"] or 0.0),
                "gateway_ms": 1000 * (ttft - line["ttft_s"]),
                "prompt_tokens": line["prompt_tokens"],
                "uncached_tokens": line["prompt_tokens"] - line["cached_tokens"],
            }
        )
    answered = sum(1 for r in per_request if r[2] is not None)
    out: dict[str, Any] = {"joined": len(rows), "answered": answered}
    if len(rows) < 2:
        return out
    for part in ("client", "backend", "queue", "gateway"):
        out[part] = _pcts([r[f"{part}_ms"] / 1000 for r in rows])
    slowest = sorted(rows, key=lambda r: -r["client_ms"])
    for share in (1, 5):
        tail = slowest[: max(1, len(rows) * share // 100)]
        out[f"slowest_{share}pct"] = {
            k: statistics.fmean(r[k] for r in tail)
            for k in ("client_ms", "backend_ms", "queue_ms", "gateway_ms", "prompt_tokens",
                      "uncached_tokens")
        }  # fmt: skip
    out["slowest"] = [{k: round(v, 2) for k, v in r.items()} for r in slowest[:_KEEP]]
    out["rows"] = rows  # every request (bench/routing.py keeps them beside its logs)
    return out


def split_line(s: dict[str, Any]) -> str:
    """One printable line of :func:`split`'s summary."""
    if "client" not in s:
        return f"joined {s['joined']} of {s['answered']}"
    parts = " | ".join(
        f"{k} p50 {s[k]['p50_ms']:.0f} p99 {s[k]['p99_ms']:.0f}"
        for k in ("client", "backend", "queue", "gateway")
    )
    tail = s["slowest_1pct"]
    return (
        f"joined {s['joined']}/{s['answered']}: {parts} ms; slowest 1%: client"
        f" {tail['client_ms']:.0f} = backend {tail['backend_ms']:.0f} (queue {tail['queue_ms']:.0f})"
        f" + gateway {tail['gateway_ms']:.0f} ms, {tail['uncached_tokens']:.0f} of"
        f" {tail['prompt_tokens']:.0f} tokens uncached"
    )
