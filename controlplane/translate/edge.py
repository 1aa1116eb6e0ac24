"""What an edge (gateway) connection manager adds for untrusted clients. Pure.

- Client-supplied ``x-tokenweir-*`` headers are removed *before route matching* (Envoy's early
  header mutation), so a client can never pick a route, a lane or the filters a request gets by
  sending an internal header; only the filter server sets them afterwards.
- Envoy's own error replies (no route, no healthy upstream, overflow, timeouts, resets) get an
  OpenAI-style JSON body, like every error the filter and rate-limit servers send.
"""

from __future__ import annotations

from envoy.config.accesslog.v3 import accesslog_pb2
from envoy.config.common.mutation_rules.v3 import mutation_rules_pb2
from envoy.config.core.v3 import extension_pb2, substitution_format_string_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.http.early_header_mutation.header_mutation.v3 import header_mutation_pb2
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import struct_pb2

from controlplane.translate.protos import any_of

__all__ = [
    "ENVOY_ERROR_FLAGS",
    "INTERNAL_HEADER_PREFIX",
    "openai_local_replies",
    "strip_internal_headers",
]

INTERNAL_HEADER_PREFIX = "x-tokenweir-"

# Response flags of replies Envoy makes up itself (the rate-limit 429 — flag RL — and the filter
# server's immediate responses already carry OpenAI-style bodies and are left alone).
ENVOY_ERROR_FLAGS = ("NR", "NC", "UH", "UF", "UO", "UT", "URX", "UC", "SI", "UMSDR", "DPE")


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
    no_route = _mapper(("NR",), "no route matches this method, host and path")
    other = _mapper(ENVOY_ERROR_FLAGS, "%LOCAL_REPLY_BODY%")
    return hcm_pb2.LocalReplyConfig(mappers=[no_route, other])


def _mapper(flags: tuple[str, ...], message: str) -> hcm_pb2.ResponseMapper:
    body = struct_pb2.Struct()
    body.update(
        {"error": {"message": message, "type": "gateway_error", "code": "%RESPONSE_CODE_DETAILS%"}}
    )
    return hcm_pb2.ResponseMapper(
        filter=accesslog_pb2.AccessLogFilter(
            response_flag_filter=accesslog_pb2.ResponseFlagFilter(flags=list(flags))
        ),
        body_format_override=substitution_format_string_pb2.SubstitutionFormatString(
            json_format=body, content_type="application/json"
        ),
    )
