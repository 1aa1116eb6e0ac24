"""What one dashboard round costs on a busy filter server's ``/metrics`` page, two ways side by
side: ``parser`` (the whole page through ``prometheus_client``'s parser: the collector before)
and ``now`` (:func:`controlplane.dashboard.summary.totals_of`: the lines it reads, histogram
buckets taken straight off their lines). The page is a real ``FilterMetrics`` registry with
``--tenants`` tenants, each with the children a streamed request leaves in both lanes.

``.venv/bin/python bench/dashboard_parse.py [--tenants 100] [--rounds 10]``

Prints CPU ms per page (median of ``--rounds``, arms alternating) and the ratio; JSON:
``bench/results/dashboard_parse.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.dashboard.summary import totals_of
from filters.metrics import FilterMetrics
from filters.plugins.admission.metrics import AdmissionMetrics

OUT = Path(__file__).resolve().parent / "results" / "dashboard_parse.json"


def page(tenants: int) -> str:
    m = FilterMetrics(CollectorRegistry())
    AdmissionMetrics(m.registry).limit.labels("chat").set(12)
    for t in range(tenants):
        for lane in ("interactive", "batch"):
            ttft, tbt = m.stream_timers(f"t{t}", "m1", lane)
            ttft.observe(0.1)
            tbt.observe(0.01)
            m.request_done("llm", lane, "m1", f"t{t}", "ok", 0.5)
        p, c, k = m.token_counters(f"t{t}", "m1")
        p.inc(10)
        c.inc(10)
        k.inc(1)
        m.spent(f"t{t}", "m1", 0.1)
        m.child(m.tokens_per_second, f"t{t}", "m1").observe(50)
    return generate_latest(m.registry).decode()


def parser(text: str) -> None:
    for fam in text_string_to_metric_families(text):
        for _ in fam.samples:
            pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tenants", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    text = page(args.tenants)
    arms = {"parser": parser, "now": lambda x: totals_of([x])}
    ms: dict[str, list[float]] = {a: [] for a in arms}
    for _ in range(args.rounds):
        for name, fn in arms.items():
            t0 = time.process_time()
            fn(text)
            ms[name].append((time.process_time() - t0) * 1000)
    med = {a: round(statistics.median(v), 1) for a, v in ms.items()}
    result = {"tenants": args.tenants, "page_kb": len(text) // 1024, "cpu_ms_median": med,
              "ratio": round(med["parser"] / med["now"], 1)}  # fmt: skip
    print(json.dumps(result))
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
