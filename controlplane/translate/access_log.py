"""The gateway's JSON access log (policy ``gateways.<name>.access_log``). Pure.

One JSON object per request. Who the request was for (tenant, tier, lane, model) and what it cost
(prompt / completion / cached tokens, TTFT, USD) come from **dynamic metadata** the filter server
sets (namespace ``tokenweir``), and the rate-limit decision from the metadata the rate-limit
service returns (namespace ``envoy.filters.http.ratelimit``): never from request headers, so a
client cannot put another tenant's name into the log (``x-tenant``, ``x-tokenweir-tenant``).
docs/operations.md "Access logs" lists the fields.
"""

from __future__ import annotations

from envoy.config.accesslog.v3 import accesslog_pb2
from envoy.config.core.v3 import substitution_format_string_pb2 as sfs_pb2
from envoy.extensions.access_loggers.file.v3 import file_pb2
from google.protobuf import struct_pb2

from controlplane.translate.protos import any_of
from policy.model import AccessLog

__all__ = ["ACCESS_LOG_FIELDS", "access_logs"]

_TW = "tokenweir"
_RL = "envoy.filters.http.ratelimit"

ACCESS_LOG_FIELDS: dict[str, str] = {
    "time": "%START_TIME%",
    "request_id": "%REQ(X-REQUEST-ID)%",
    "method": "%REQ(:METHOD)%",
    "path": "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%",
    "status": "%RESPONSE_CODE%",
    "flags": "%RESPONSE_FLAGS%",
    "details": "%RESPONSE_CODE_DETAILS%",
    "duration_ms": "%DURATION%",
    "upstream_ms": "%RESPONSE_DURATION%",
    "route": "%ROUTE_NAME%",
    "upstream_cluster": "%UPSTREAM_CLUSTER%",
    "upstream_replica": "%UPSTREAM_HOST%",
    "client": "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%",
    "bytes_sent": "%BYTES_SENT%",
    "tenant": f"%DYNAMIC_METADATA({_TW}:tenant)%",
    "tier": f"%DYNAMIC_METADATA({_TW}:tier)%",
    "lane": f"%DYNAMIC_METADATA({_TW}:lane)%",
    "model": f"%DYNAMIC_METADATA({_TW}:model)%",
    "reserved_tokens": f"%DYNAMIC_METADATA({_TW}:reserve)%",
    "prompt_tokens": f"%DYNAMIC_METADATA({_TW}:prompt_tokens)%",
    "completion_tokens": f"%DYNAMIC_METADATA({_TW}:completion_tokens)%",
    "cached_tokens": f"%DYNAMIC_METADATA({_TW}:cached_tokens)%",
    "ttft_ms": f"%DYNAMIC_METADATA({_TW}:ttft_ms)%",
    # the endpoint picker's prediction beside the actuals above (routing regret)
    "picked_replica": f"%DYNAMIC_METADATA({_TW}:replica)%",
    "predicted_cached_tokens": f"%DYNAMIC_METADATA({_TW}:predicted_cached_tokens)%",
    "predicted_ttft_ms": f"%DYNAMIC_METADATA({_TW}:predicted_ttft_ms)%",
    "cost_usd": f"%DYNAMIC_METADATA({_TW}:cost_usd)%",
    "ratelimit": f"%DYNAMIC_METADATA({_RL}:decision)%",
    "ratelimit_reason": f"%DYNAMIC_METADATA({_RL}:reason)%",
    "retry_after_s": f"%DYNAMIC_METADATA({_RL}:retry_after_s)%",
}


def access_logs(log: AccessLog | None) -> list[accesslog_pb2.AccessLog]:
    """The HCM's ``access_log`` list: one file logger writing JSON lines, or none."""
    if log is None or not log.enabled:
        return []
    fmt = struct_pb2.Struct()
    fmt.update(ACCESS_LOG_FIELDS)
    cfg = file_pb2.FileAccessLog(
        path=log.path,
        log_format=sfs_pb2.SubstitutionFormatString(json_format=fmt),
    )
    return [accesslog_pb2.AccessLog(name="envoy.access_loggers.file", typed_config=any_of(cfg))]
