"""What an edge (gateway) connection manager adds for untrusted clients. Pure.

- Client-supplied ``x-tokenweir-*`` headers are removed *before route matching* (Envoy's early
  header mutation), so a client can never pick a route, a lane or the filters a request gets by
  sending an internal header; only the filter server sets them afterwards.
- Envoy's own error replies (no route, no healthy upstream, overflow, timeouts, resets, a body
  or headers too large, a malformed request, the filter server timing out) get an OpenAI-style
  JSON body, like every error the filter and rate-limit servers send; replies that already carry
  one (the filter server's, ``tokenweir_*`` details, and the rate-limit 429) are left alone.
  Every such reply of status 5xx says ``retry-after: 1`` (an overflowing circuit breaker, no
  healthy upstream, a refused or reset connection, retries exhausted, a timeout): Envoy knows
  nothing of when the pool recovers, and a client told nothing retries at once; its 4xx say
  nothing (retrying the same request does not help).
- A body declared larger than a route accepts (``content-length``) is answered by a route of its
  own before any filter reads it: Envoy answers 413 at once, without buffering, so there is no
  race between the filter server's answer and Envoy's own buffer-limit 413.
"""

from __future__ import annotations

import json

from envoy.config.accesslog.v3 import accesslog_pb2
from envoy.config.common.mutation_rules.v3 import mutation_rules_pb2
from envoy.config.core.v3 import base_pb2, extension_pb2, substitution_format_string_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.extensions.access_loggers.filters.cel.v3 import cel_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.http.early_header_mutation.header_mutation.v3 import header_mutation_pb2
from envoy.type.matcher.v3 import string_pb2
from envoy.type.v3 import range_pb2
from google.protobuf import struct_pb2

from controlplane.translate.ext_proc import EXT_PROC_FILTER, ext_proc_oversize_per_route
from controlplane.translate.protos import Packed, any_of
from wire.contract import HEADER_PREFIX

__all__ = [
    "ENVOY_ERROR_FLAGS",
    "INTERNAL_HEADER_PREFIX",
    "OVERFLOW_RETRY_AFTER_S",
    "openai_local_replies",
    "strip_internal_headers",
    "too_large_route",
]

INTERNAL_HEADER_PREFIX = HEADER_PREFIX

# Response flags of replies Envoy makes up itself (the rate-limit 429 — flag RL — and the filter
# server's immediate responses already carry OpenAI-style bodies and are left alone).
ENVOY_ERROR_FLAGS = ("NR", "NC", "UH", "UF", "UO", "UT", "URX", "UC", "SI", "UMSDR", "DPE")
# Every other reply Envoy makes up (a codec error's 400, the buffer limit's 413, 431, the
# ext_proc message timeout's 504, ...) carries no flag: it is recognised by its details instead.
_OWN_JSON = "response.code_details.startsWith('tokenweir_') || response.code_details in {kinds}"
_ALREADY_JSON = ("request_rate_limited", "direct_response")
OVERFLOW_RETRY_AFTER_S = 1  # an overflowing breaker drains in well under a second at our rates
_MAX_INT64 = 2**63 - 1


def strip_internal_headers() -> extension_pb2.TypedExtensionConfig:
    mutation = header_mutation_pb2.HeaderMutation(
        mutations=[
            mutation_rules_pb2.HeaderMutation(
                remove_on_match=mutation_rules_pb2.HeaderMutation.RemoveOnMatch(
                    key_matcher=string_pb2.StringMatcher(prefix=INTERNAL_HEADER_PREFIX)
                )
            )
        ]
    )
    return extension_pb2.TypedExtensionConfig(
        name="tokenweir.strip_internal_headers", typed_config=any_of(mutation)
    )


def openai_local_replies() -> hcm_pb2.LocalReplyConfig:
    retry = {"retry-after": str(OVERFLOW_RETRY_AFTER_S)}
    no_route = _mapper(_flags(("NR",)), "no route matches this method, host and path")
    overflow = _mapper(
        _flags(("UO",)),
        "the upstream is at its concurrency limit (circuit breaker); retry shortly",
        headers=retry,
    )
    flagged_5xx = _mapper(
        accesslog_pb2.AccessLogFilter(
            and_filter=accesslog_pb2.AndFilter(filters=[_flags(ENVOY_ERROR_FLAGS), _cel(_5XX)])
        ),
        "%LOCAL_REPLY_BODY%",
        headers=retry,
    )
    flagged = _mapper(_flags(ENVOY_ERROR_FLAGS), "%LOCAL_REPLY_BODY%")
    kinds = "[" + ", ".join(f"'{k}'" for k in _ALREADY_JSON) + "]"
    own = _OWN_JSON.format(kinds=kinds)
    rest_5xx = _mapper(_cel(f"{_5XX} && !({own})"), "%LOCAL_REPLY_BODY%", headers=retry)
    rest = _mapper(_cel(f"response.code >= 400 && !({own})"), "%LOCAL_REPLY_BODY%")
    return hcm_pb2.LocalReplyConfig(
        mappers=[no_route, overflow, flagged_5xx, flagged, rest_5xx, rest]
    )


_5XX = "response.code >= 500"


def _cel(expression: str) -> accesslog_pb2.AccessLogFilter:
    return accesslog_pb2.AccessLogFilter(
        extension_filter=accesslog_pb2.ExtensionFilter(
            name="envoy.access_loggers.extension_filters.cel",
            typed_config=any_of(cel_pb2.ExpressionFilter(expression=expression)),
        )
    )


def _flags(flags: tuple[str, ...]) -> accesslog_pb2.AccessLogFilter:
    return accesslog_pb2.AccessLogFilter(
        response_flag_filter=accesslog_pb2.ResponseFlagFilter(flags=list(flags))
    )


def _mapper(
    match: accesslog_pb2.AccessLogFilter, message: str, headers: dict[str, str] | None = None
) -> hcm_pb2.ResponseMapper:
    body = struct_pb2.Struct()
    body.update(
        {"error": {"message": message, "type": "gateway_error", "code": "%RESPONSE_CODE_DETAILS%"}}
    )
    mapper = hcm_pb2.ResponseMapper(
        filter=match,
        body_format_override=substitution_format_string_pb2.SubstitutionFormatString(
            json_format=body, content_type="application/json"
        ),
    )
    for key, value in (headers or {}).items():
        mapper.headers_to_add.append(
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=key, value=value),
                append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
            )
        )
    return mapper


def too_large_route(name: str, match: rc.RouteMatch, limit: int, filters: list[str]) -> rc.Route:
    """A route for requests whose ``content-length`` exceeds ``limit``: 413 with an OpenAI-style
    body, the route's filters (``filters``: their names) switched off but the filter server's,
    which reads the body to its end first (see ``ext_proc_oversize_per_route``); the route's
    direct 413 answers when there is no filter server."""
    m = rc.RouteMatch()
    m.CopyFrom(match)
    m.headers.append(
        rc.HeaderMatcher(
            name="content-length",
            range_match=range_pb2.Int64Range(start=limit + 1, end=_MAX_INT64),
        )
    )
    body = {
        "error": {
            "message": f"the request body is larger than this route accepts ({limit} bytes)",
            "type": "invalid_request_error",
            "param": None,
            "code": 413,
        }
    }
    r = rc.Route(
        name=f"{name}/too_large",
        match=m,
        direct_response=rc.DirectResponseAction(
            status=413, body=base_pb2.DataSource(inline_string=json.dumps(body))
        ),
        response_headers_to_add=[
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key="content-type", value="application/json"),
                append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
            )
        ],
    )
    for f in filters:
        r.typed_per_filter_config[f].CopyFrom(_disabled())
    if EXT_PROC_FILTER in filters:
        r.typed_per_filter_config[EXT_PROC_FILTER].CopyFrom(ext_proc_oversize_per_route(limit))
    return r


def _disabled() -> Packed:
    return any_of(rc.FilterConfig(disabled=True))
