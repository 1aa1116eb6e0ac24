"""Each request's TTFT split into the backend's share and the gateway's (bench/routing_split.py)."""

from __future__ import annotations

import json
from pathlib import Path

from routing_split import read_logs, split, split_line


def _log(path: Path, lines: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _line(rid: str, ttft: float | None, queue: float = 0.0, prompt: int = 100, cached: int = 0):
    return {"rid": rid, "queue_s": queue, "ttft_s": ttft, "e2e_s": 1.0, "prompt_tokens": prompt,
            "cached_tokens": cached, "output_tokens": 5, "finish": "length"}  # fmt: skip


def test_requests_join_by_id_across_replica_logs_and_split(tmp_path: Path) -> None:
    logs = read_logs(
        [
            _log(tmp_path / "r0.jsonl", [_line("a", 0.010, 0.002), _line("b", 0.100, 0.080)]),
            tmp_path / "absent.jsonl",  # a replica that served nothing wrote no file
            _log(tmp_path / "r2.jsonl", [_line("c", 0.020, prompt=3000, cached=1000)]),
        ]
    )
    assert {k: v["replica"] for k, v in logs.items()} == {"a": 0, "b": 0, "c": 2}
    per_request = [
        (0, 0.0, 0.015, "a"),
        (1, 0.0, 0.130, "b"),
        (2, 0.1, 0.060, "c"),
        (3, 0.1, None, None),  # failed: not joined
        (4, 0.2, 0.050, "unknown"),  # no backend line: not joined
    ]
    s = split(per_request, logs)
    assert (s["joined"], s["answered"]) == (3, 4)
    rows = {r["job"]: r for r in s["rows"]}
    assert round(rows[1]["gateway_ms"], 6) == 30.0 and rows[1]["queue_ms"] == 80.0
    assert rows[2]["uncached_tokens"] == 2000 and rows[2]["replica"] == 2
    assert [r["job"] for r in s["slowest"]] == [1, 2, 0]
    assert s["slowest_1pct"]["client_ms"] == 130.0  # the slowest one of three
    assert s["backend"]["p50_ms"] == 20.0
    assert "joined 3/4" in split_line({k: v for k, v in s.items() if k != "rows"})


def test_too_few_joined_gives_counts_only() -> None:
    s = split([(0, 0.0, 0.01, "a")], {})
    assert s == {"joined": 0, "answered": 1}
    assert split_line(s) == "joined 0 of 1"
