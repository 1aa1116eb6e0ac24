"""RateLimitResponse builders: OK with the tightest quota, OVER_LIMIT with retry-after, x-ratelimit
headers and an OpenAI-style JSON error body (``raw_body``). uint32 fields are clamped (fact 6)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from envoy.config.core.v3 import base_pb2
from envoy.service.ratelimit.v3 import rls_pb2
from google.protobuf import duration_pb2, struct_pb2

from wire.contract import SHADOW_OVER_LIMIT_HEADER

__all__ = ["U32_MAX", "Verdict", "error_response", "ok_response", "response"]

U32_MAX = 2**32 - 1
_RL = rls_pb2.RateLimitResponse
OK = _RL.OK
OVER_LIMIT = _RL.OVER_LIMIT
_UNITS = {
    "minute": _RL.RateLimit.MINUTE,
    "hour": _RL.RateLimit.HOUR,
    "day": _RL.RateLimit.DAY,
    "month": _RL.RateLimit.MONTH,
}


@dataclass(frozen=True, slots=True)
class Verdict:
    """The decision for one descriptor: the limit to report (denying or tightest)."""

    ok: bool
    quota: str = ""
    unit: str = ""
    limit: int = 0
    remaining: int = 0
    reset_us: int = 0  # until the bucket is full / the window resets (OK) or retry (deny)
    retry_us: int = 0  # -1: cannot ever fit
    requested: int = 0
    kind: str = "tokens"
    subject: str = ""
    shadow_denied: tuple[str, ...] = ()


def clamp32(value: int) -> int:
    return 0 if value < 0 else (U32_MAX if value > U32_MAX else value)


def _duration(us: int) -> duration_pb2.Duration:
    us = max(0, us)
    return duration_pb2.Duration(seconds=us // 1_000_000, nanos=(us % 1_000_000) * 1000)


def _unit(v: Verdict) -> int:
    if v.unit in _UNITS:
        return _UNITS[v.unit]
    return _RL.RateLimit.MINUTE  # a bucket: reported as its burst; the reset says when it refills


def _status(v: Verdict) -> rls_pb2.RateLimitResponse.DescriptorStatus:
    if not v.quota:
        return _RL.DescriptorStatus(code=OK if v.ok else OVER_LIMIT)
    return _RL.DescriptorStatus(
        code=OK if v.ok else OVER_LIMIT,
        current_limit=_RL.RateLimit(
            name=f"{v.quota}.{v.unit}", requests_per_unit=clamp32(v.limit), unit=_unit(v)
        ),
        limit_remaining=clamp32(v.remaining),
        duration_until_reset=_duration(v.retry_us if not v.ok and v.retry_us > 0 else v.reset_us),
    )


def _header(key: str, value: str) -> base_pb2.HeaderValue:
    return base_pb2.HeaderValue(key=key, value=value)


def _amount(v: Verdict, value: int) -> str:
    return f"${value / 1e6:.6f}" if v.kind == "usd" else str(value)


def _message(v: Verdict) -> str:
    what = f"{v.quota} ({'token bucket' if v.unit == 'bucket' else 'per ' + v.unit})"
    if v.retry_us < 0:
        return (
            f"Request for {_amount(v, v.requested)} {v.kind} exceeds quota {what} of {v.subject}, "
            f"which allows at most {_amount(v, v.limit)}; lower max_tokens or shorten the prompt."
        )
    return (
        f"Rate limit reached for {v.subject} on quota {what}: limit {_amount(v, v.limit)}, "
        f"remaining {_amount(v, max(0, v.remaining))}, requested {_amount(v, v.requested)}. "
        f"Please try again in {math.ceil(v.retry_us / 1e6)}s."
    )


def _decision(decision: str, reason: str, retry_s: int | None = None) -> struct_pb2.Struct:
    """Dynamic metadata for Envoy's access log (namespace envoy.filters.http.ratelimit)."""
    md = struct_pb2.Struct()
    md.update({"decision": decision, "reason": reason})
    if retry_s is not None:
        md.update({"retry_after_s": retry_s})
    return md


def error_response(
    message: str, code: str, kind: str, retry_s: int | None = None
) -> rls_pb2.RateLimitResponse:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    headers = [_header("content-type", "application/json")]
    if retry_s is not None:
        headers.append(_header("retry-after", str(retry_s)))
    return _RL(
        dynamic_metadata=_decision("error", code, retry_s),
        overall_code=OVER_LIMIT,
        response_headers_to_add=headers,
        raw_body=json.dumps(body).encode(),
    )


def ok_response(verdicts: list[Verdict]) -> rls_pb2.RateLimitResponse:
    tight = next((v for v in verdicts if v.quota), None)
    reason = f"{tight.quota}.{tight.unit}" if tight is not None else "unlimited"
    resp = _RL(
        overall_code=OK,
        statuses=[_status(v) for v in verdicts],
        dynamic_metadata=_decision("ok", reason),
    )
    shadow = sorted({q for v in verdicts for q in v.shadow_denied})
    if shadow:
        resp.response_headers_to_add.append(_header(SHADOW_OVER_LIMIT_HEADER, ",".join(shadow)))
    return resp


def response(verdicts: list[Verdict]) -> rls_pb2.RateLimitResponse:
    denied = [v for v in verdicts if not v.ok]
    if not denied:
        return ok_response(verdicts)
    v = denied[0]
    headers = [
        _header("content-type", "application/json"),
        _header("x-ratelimit-quota", f"{v.quota}.{v.unit}"),
    ]
    retry_s = max(1, math.ceil(v.retry_us / 1e6)) if v.retry_us >= 0 else None
    if retry_s is not None:
        headers.append(_header("retry-after", str(retry_s)))
    body = {
        "error": {
            "message": _message(v),
            "type": v.kind,
            "param": "max_tokens" if v.retry_us < 0 and v.kind != "requests" else None,
            "code": "rate_limit_exceeded",
            "quota": f"{v.quota}.{v.unit}",
        }
    }
    return _RL(
        dynamic_metadata=_decision("over_limit", f"{v.quota}.{v.unit}", retry_s),
        overall_code=OVER_LIMIT,
        statuses=[_status(x) for x in verdicts],
        response_headers_to_add=headers,
        raw_body=json.dumps(body).encode(),
    )
