"""Primary vs shadow, request by request: the record of one pair and the summary of many.

Pure data and arithmetic, shared by the filter server (which joins the two sides of a pair and
writes it to Redis) and the CLI (``tokenweir shadow``, which reads them back). One pair is one
sampled request: its *primary* side is what the client got (seen by the filter server's
``shadow`` plugin), its *shadow* side what the shadow pool answered the mirror (seen by the
shadow recorder). A side is an error when its status is not 200, its answer was cut, it never
came (``absent``), it was dropped by a bound, or it reported no output tokens.

Redis layout: ``tw:{shadow}:pairs:<route>``, a list of JSON pairs, newest first, trimmed to the
route's ``shadow.keep`` and expiring ``shadow.ttl`` after the last write (one hash slot for all
routes: a Redis Cluster takes it like one key).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TypedDict

__all__ = [
    "Pair",
    "Side",
    "SideFigures",
    "Summary",
    "decode_pair",
    "judge",
    "pairs_key",
    "summarize",
]


def pairs_key(route: str) -> str:
    return f"tw:{{shadow}}:pairs:{route}"


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a pair. Times in seconds from when the gateway sent the request on."""

    status: int = 0
    ttft_s: float | None = None
    latency_s: float | None = None
    completion_tokens: int | None = None
    error: str | None = None  # None: a good answer

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class Pair:
    id: str
    route: str
    request_id: str
    at: float  # wall-clock time the pair was completed
    primary: Side
    shadow: Side

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()


def _side(obj: object) -> Side:
    if not isinstance(obj, dict):
        raise ValueError("a side must be an object")
    return Side(
        status=int(obj.get("status", 0)),
        ttft_s=_num(obj.get("ttft_s")),
        latency_s=_num(obj.get("latency_s")),
        completion_tokens=None if obj.get("completion_tokens") is None
        else int(obj["completion_tokens"]),
        error=None if obj.get("error") is None else str(obj["error"]),
    )  # fmt: skip


def _num(v: object) -> float | None:
    if v is None:
        return None
    if isinstance(v, int | float | str):
        return float(v)
    raise TypeError(f"float() argument must be a string or a real number, not {type(v).__name__!r}")


def decode_pair(raw: bytes | str) -> Pair:
    """A pair as :meth:`Pair.encode` wrote it; ``ValueError`` for anything else."""
    try:
        obj = json.loads(raw)
        return Pair(
            id=str(obj["id"]),
            route=str(obj["route"]),
            request_id=str(obj.get("request_id", "")),
            at=float(obj["at"]),
            primary=_side(obj["primary"]),
            shadow=_side(obj["shadow"]),
        )
    except (KeyError, TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"not a shadow pair: {exc}") from None


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class SideFigures(TypedDict):
    """One side of many pairs (:func:`summarize`); times in seconds."""

    errors: int
    errors_by_kind: dict[str, int]
    latency_p50_s: float | None
    latency_p95_s: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    completion_tokens_mean: float | None


class Summary(TypedDict):
    pairs: int
    both_ok: int
    same_output_tokens: int
    latency_ratio_p50: float | None
    primary: SideFigures
    shadow: SideFigures


def _figures(sides: list[Side]) -> SideFigures:
    good = [s for s in sides if s.ok]
    lat = [s.latency_s for s in good if s.latency_s is not None]
    ttft = [s.ttft_s for s in good if s.ttft_s is not None]
    toks = [s.completion_tokens for s in good if s.completion_tokens is not None]
    errors: dict[str, int] = {}
    for s in sides:
        if s.error is not None:
            errors[s.error] = errors.get(s.error, 0) + 1
    return {
        "errors": sum(errors.values()),
        "errors_by_kind": dict(sorted(errors.items())),
        "latency_p50_s": _quantile(lat, 0.5),
        "latency_p95_s": _quantile(lat, 0.95),
        "ttft_p50_s": _quantile(ttft, 0.5),
        "ttft_p95_s": _quantile(ttft, 0.95),
        "completion_tokens_mean": sum(toks) / len(toks) if toks else None,
    }


def summarize(pairs: Iterable[Pair]) -> Summary:
    """Per side: errors (by kind), latency and TTFT p50/p95, mean output tokens of good
    answers; per pair: how many both answered well, with the same output tokens, and the
    shadow's latency over the primary's (p50 of the per-pair ratio)."""
    items = list(pairs)
    both = [p for p in items if p.primary.ok and p.shadow.ok]
    ratios = [
        p.shadow.latency_s / p.primary.latency_s
        for p in both
        if p.shadow.latency_s is not None and p.primary.latency_s
    ]
    return {
        "pairs": len(items),
        "both_ok": len(both),
        "same_output_tokens": sum(
            1 for p in both if p.primary.completion_tokens == p.shadow.completion_tokens
        ),
        "latency_ratio_p50": _quantile(ratios, 0.5),
        "primary": _figures([p.primary for p in items]),
        "shadow": _figures([p.shadow for p in items]),
    }


def judge(
    status: int,
    complete: bool,
    tokens: int | None,
    error: str | None,
    ttft: float | None,
    latency: float,
) -> Side:
    """A side from what was seen: the first failure wins (transport, status, cut, no output)."""
    if error is None:
        if status != 200:
            error = "status"
        elif not complete:
            error = "cut"
        elif not tokens:
            error = "no_output"
    return Side(status, ttft, latency, tokens, error)
