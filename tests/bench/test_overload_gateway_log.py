"""The gateway-timed rejections of the overload benchmark (bench/overload_gateway_log.py)."""

from __future__ import annotations

import json
from pathlib import Path

from overload_gateway_log import AccessLogTail, rejection_durations, summary


def _line(status: int, duration: object, replica: object = None) -> str:
    return json.dumps({"status": status, "duration_ms": duration, "upstream_replica": replica})


def test_only_the_gateways_own_rejections_count() -> None:
    lines = [
        "[2026-12-03 10:00:00.000][1][warning] an Envoy log line",
        _line(429, 3),
        _line(503, 7, "-"),
        _line(504, 1),
        _line(503, 40, "127.0.0.1:9000"),  # the backend's own 503 passed through
        _line(200, 900),
        _line(503, "x"),
        _line(503, True),
        "{not json",
    ]
    assert rejection_durations(lines) == [3.0, 7.0, 1.0]
    waited = json.dumps({"status": 503, "duration_ms": 4000, "details": "tokenweir_shed_timed_out"})
    quick = json.dumps({"status": 503, "duration_ms": 2, "details": "tokenweir_shed_queue_full"})
    assert rejection_durations([waited, quick]) == [4000.0, 2.0]
    assert rejection_durations([waited, quick], at_arrival=True) == [2.0]
    assert summary([3.0, 7.0, 1.0]) == {"count": 3, "p50": 3.0, "p99": 7.0, "max": 7.0}
    assert summary([]) == {"count": 0, "p50": None, "p99": None, "max": None}


def test_the_tail_reads_whole_lines_written_since_the_mark(tmp_path: Path) -> None:
    log = tmp_path / "envoy.log"
    tail = AccessLogTail(log)
    tail.mark()  # no file yet
    assert tail.since_mark() == []
    log.write_text(_line(429, 5) + "\n")
    tail.mark()
    with log.open("a") as f:
        f.write(_line(503, 2) + "\n" + _line(503, 9))  # the last line is not finished
    assert rejection_durations(tail.since_mark()) == [2.0]
