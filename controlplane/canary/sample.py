"""Reading a canary sample from metrics pages: the gateway's responses per version (the filter
server's ``tokenweir_filters_version_responses_total``) and the replicas' cumulative TTFT and
inter-token histograms (SGLang's ``sglang:time_to_first_token_seconds`` and
``sglang:inter_token_latency_seconds``, the pages the pool scraper already reads)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

from controlplane.canary.errors import CanaryError
from controlplane.canary.judge import Buckets, VersionCounts

__all__ = ["gateway_counts", "replica_counters", "replica_histograms", "version_counts"]

_TTFT = "sglang:time_to_first_token_seconds"
_TBT = "sglang:inter_token_latency_seconds"
_RESPONSES = "tokenweir_filters_version_responses"


def _families(text: str) -> Iterable[object]:
    try:
        return list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise CanaryError(f"bad metrics page: {exc}") from exc


def replica_histograms(pages: Iterable[str]) -> tuple[Buckets, Buckets]:
    """TTFT and inter-token buckets summed over the replicas' pages (cumulative)."""
    sums: dict[str, dict[float, float]] = {_TTFT: defaultdict(float), _TBT: defaultdict(float)}
    for text in pages:
        for fam in _families(text):
            name = getattr(fam, "name", "")
            if name not in sums:
                continue
            for s in getattr(fam, "samples", ()):
                if s.name.endswith("_bucket"):
                    sums[name][float(s.labels["le"])] += s.value
    return tuple(sorted(sums[_TTFT].items())), tuple(sorted(sums[_TBT].items()))


def gateway_counts(pages: Iterable[str], pool: str) -> dict[str, tuple[float, float]]:
    """version → (responses, 5xx) summed over the filter processes' pages."""
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for text in pages:
        for fam in _families(text):
            if getattr(fam, "name", "") != _RESPONSES:
                continue
            for s in getattr(fam, "samples", ()):
                if not s.name.endswith("_total") or s.labels.get("pool") != pool:
                    continue
                row = out[s.labels.get("version", "")]
                row[0] += s.value
                if s.labels.get("code") == "5xx":
                    row[1] += s.value
    return {v: (r[0], r[1]) for v, r in out.items()}


def version_counts(
    gateway: dict[str, tuple[float, float]], hist: dict[str, tuple[Buckets, Buckets]]
) -> dict[str, VersionCounts]:
    out = {}
    for version in ("baseline", "canary"):
        responses, errors = gateway.get(version, (0.0, 0.0))
        ttft, tbt = hist.get(version, ((), ()))
        out[version] = VersionCounts(responses, errors, ttft, tbt)
    return out


_COUNTERS = {
    "sglang:num_requests": "requests",
    "sglang:num_aborted_requests": "aborted",
    "sglang:generation_tokens": "completion_tokens",
    "sglang:prompt_tokens": "prompt_tokens",
}


def replica_counters(pages: Iterable[str]) -> dict[str, float]:
    """Finished and aborted requests, prompt and completion tokens, summed over the pages."""
    out = dict.fromkeys(_COUNTERS.values(), 0.0)
    for text in pages:
        for fam in _families(text):
            key = _COUNTERS.get(getattr(fam, "name", ""))
            if key is None:
                continue
            for s in getattr(fam, "samples", ()):
                if s.name.endswith("_total"):
                    out[key] += s.value
    return out
