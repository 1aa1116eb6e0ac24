"""Read the load gauges out of an SGLang server's ``/metrics`` text (Prometheus exposition).

The text is parsed with ``prometheus_client``'s parser, after a line filter that keeps only the
load gauges' sample lines (the parser costs ~45 µs a line and a server's page has ~150 lines of
histograms the signal does not read: 6.5 ms → about 0.3 ms per scrape, docs/operations.md). SGLang labels every gauge with
``model_name`` (and with data parallelism one series per rank): counts are summed over the
series, ``token_usage`` is the largest, ``cache_hit_rate`` the mean.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from poolstate.errors import MetricsTextError

__all__ = ["GAUGES", "ReplicaSample", "parse_metrics_text"]

GAUGES = (
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:num_used_tokens",
    "sglang:token_usage",
    "sglang:gen_throughput",
    "sglang:cache_hit_rate",
    "sglang:max_total_num_tokens",
)
_GAUGE_LINE = re.compile(
    "^(?:" + "|".join(re.escape(g) for g in GAUGES) + r")(?:\{[^\n]*\})?[ \t][^\n]*$", re.M
)


@dataclass(frozen=True, slots=True)
class ReplicaSample:
    """What one scrape says; ``None`` where the server did not export the gauge."""

    running: int | None = None
    queued: int | None = None
    used_tokens: int | None = None
    token_usage: float | None = None
    gen_throughput: float | None = None
    cache_hit_rate: float | None = None
    max_total_tokens: int | None = None

    @property
    def complete(self) -> bool:
        """The two gauges saturation cannot do without are present."""
        return self.running is not None and self.queued is not None


def _gauge_lines(text: str) -> str:
    """The sample lines of ``text`` that belong to :data:`GAUGES` (one regex pass)."""
    return "\n".join(_GAUGE_LINE.findall(text)) + "\n"


def parse_metrics_text(text: str) -> ReplicaSample:
    """Pure: the SGLang load gauges in ``text``; MetricsTextError when it is not exposition."""
    values: dict[str, list[float]] = {}
    try:
        for family in text_string_to_metric_families(_gauge_lines(text)):
            if family.name not in GAUGES:
                continue
            for sample in family.samples:
                if sample.name == family.name:
                    values.setdefault(family.name, []).append(float(sample.value))
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsTextError(f"not Prometheus text exposition: {exc}") from exc

    def total(name: str) -> int | None:
        v = values.get(name)
        return None if not v else int(sum(x for x in v if x == x))

    def largest(name: str) -> float | None:
        v = [x for x in values.get(name, ()) if x == x]
        return max(v) if v else None

    def mean(name: str) -> float | None:
        v = [x for x in values.get(name, ()) if x == x]
        return sum(v) / len(v) if v else None

    tput = values.get("sglang:gen_throughput")
    return ReplicaSample(
        running=total("sglang:num_running_reqs"),
        queued=total("sglang:num_queue_reqs"),
        used_tokens=total("sglang:num_used_tokens"),
        token_usage=largest("sglang:token_usage"),
        gen_throughput=None if not tput else sum(x for x in tput if x == x),
        cache_hit_rate=mean("sglang:cache_hit_rate"),
        max_total_tokens=total("sglang:max_total_num_tokens"),
    )
