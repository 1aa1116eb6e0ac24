"""A registry's Prometheus text page, byte for byte what ``prometheus_client.generate_latest``
writes, at a fraction of its cost on pages with many series.

``generate_latest`` spends about two thirds of its time (a filter server with 200 tenants:
16,900 lines, ~330 ms) building each line's ``name{labels}`` part again: sorting the labels,
checking and escaping every name and value. Between two scrapes almost every series is the one
seen before, so :class:`TextRenderer` keeps that part per (sample name, label items) and formats
only the value. The library still collects the samples (``registry.collect()``, every collector
as registered), writes the part of a series it has not seen (a one-sample page through
``generate_latest`` itself, so its escaping rules apply unchanged) and formats the values
(``floatToGoString``). ``tests/runtime/test_metrics_text.py`` checks the two pages are equal on
generated registries (every metric type, hostile label values, special floats, timestamps);
docs/benchmarks.md, "Rendering /metrics beside the data path", has the measured reason.
"""

from __future__ import annotations

import math

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import escape_metric_name
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

__all__ = ["TextRenderer"]

_OM_SUFFIXES = ("_created", "_gsum", "_gcount")  # the library's order of matching
_TYPES = {"counter": "counter", "info": "gauge", "stateset": "gauge"}
_TYPES.update({"gaugehistogram": "histogram", "unknown": "untyped"})
_PROBE_NAME = "\x00"  # a family name no sample name is equal to plus a suffix


class _One(Collector):
    """A collector of one family (what ``generate_latest`` reads)."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> list[Metric]:
        return [self.metric]


class TextRenderer:
    """``TextRenderer(registry).render()`` equals ``generate_latest(registry)``. The series cache
    is bounded (``max_series``: emptied past it, then refilled as scraped); safe to call from
    several threads at once (dict reads and writes only)."""

    def __init__(self, registry: Collector, max_series: int = 200_000) -> None:
        self.registry = registry
        self.max_series = max_series
        self._series: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
        self._headers: dict[tuple[str, str, str, str], str] = {}
        # bucket counts repeat: 0.0, 1.0, 2.0, ...; a zero is keyed (0.0, its sign)
        self._values: dict[float | tuple[float, float], str] = {}

    def render(self) -> bytes:
        out: list[str] = []
        series = self._series
        values = self._values
        for metric in self.registry.collect():
            try:
                name = metric.name
                out.append(self._header(name, metric.type, metric.documentation, ""))
                om: dict[str, list[str]] = {}
                suffixed = {name + s: s for s in _OM_SUFFIXES}
                for s in metric.samples:
                    key = (s.name, tuple(s.labels.items()))
                    head = series.get(key)
                    if head is None:
                        head = self._learn(key, s)
                    # 0.0 and -0.0 are one key but two strings: zeros by their sign
                    v = s.value if s.value else (0.0, math.copysign(1.0, s.value))
                    value = values.get(v)
                    if value is None:
                        value = floatToGoString(s.value)
                        if len(values) < 4096:
                            values[v] = value
                    ts = s.timestamp
                    if ts is None:
                        line = f"{head}{value}\n"
                    else:
                        line = f"{head}{value} {int(float(ts) * 1000):d}\n"
                    suffix = suffixed.get(s.name)
                    if suffix is None:
                        out.append(line)
                    else:
                        om.setdefault(suffix, []).append(line)
            except Exception as exception:  # as generate_latest reports a failing family
                exception.args = (exception.args or ("",)) + (metric,)
                raise
            for suffix, lines in sorted(om.items()):
                out.append(self._header(name, "gauge", metric.documentation, suffix))
                out.extend(lines)
        return "".join(out).encode("utf-8")

    def _learn(self, key: tuple[str, tuple[tuple[str, str], ...]], sample: Sample) -> str:
        """The ``name{labels} `` part of a series not seen before, as the library writes it."""
        probe = Metric(_PROBE_NAME, "", "untyped")
        probe.samples = [Sample(sample.name, sample.labels, 0.0, None)]
        text = generate_latest(_One(probe)).decode("utf-8")
        line = text[: -len("0.0\n")]  # the probe's own header lines come first
        head = line[line.rindex("\n") + 1 :]
        if len(self._series) >= self.max_series:
            self._series.clear()
        self._series[key] = head
        return head

    def _header(self, name: str, mtype: str, doc: str, suffix: str) -> str:
        """The ``# HELP`` and ``# TYPE`` lines of a family (``suffix``: of its OpenMetrics
        ``_created`` / ``_gsum`` / ``_gcount`` gauge, written after the family)."""
        key = (name, mtype, doc, suffix)
        head = self._headers.get(key)
        if head is not None:
            return head
        if suffix:
            mname, shown = name + suffix, "gauge"
        else:
            mname = name + {"counter": "_total", "info": "_info"}.get(mtype, "")
            shown = _TYPES.get(mtype, mtype) if mtype != "counter" else "counter"
        escaped = escape_metric_name(mname)
        text = doc.replace("\\", r"\\").replace("\n", r"\n")
        head = f"# HELP {escaped} {text}\n# TYPE {escaped} {shown}\n"
        if len(self._headers) >= 10_000:
            self._headers.clear()
        self._headers[key] = head
        return head
