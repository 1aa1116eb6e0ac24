"""The HTTP/2 frame layer: ``runtime.h2`` vs the maintained ``hyperframe`` library, in one run.

Parses the frames Envoy sends for one batch of rate-limit calls (HEADERS + DATA per call, a
WINDOW_UPDATE) and builds the frames answered (HEADERS, DATA, trailers), as ``runtime.h2``'s
reader and writer do it and as ``hyperframe`` (``Frame.parse_frame_header`` + ``parse_body``,
``serialize``) does it. Prints µs per call (median of rounds) and the ratio; results in
``bench/results/h2_frames.json``. ``.venv/bin/python bench/h2_frames_bench.py``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from hyperframe.frame import DataFrame, Frame, HeadersFrame

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime.h2 import frames as f  # noqa: E402

CALLS = 64
BLOCK = bytes(range(0x80, 0x80 + 40))  # an indexed header block of Envoy's size
MSG = b"\x00" + (120).to_bytes(4, "big") + b"m" * 120
WIRE = b"".join(
    f.frame(f.HEADERS, f.END_HEADERS, 2 * i + 1, BLOCK)
    + f.frame(f.DATA, f.END_STREAM, 2 * i + 1, MSG)
    for i in range(CALLS)
) + f.frame(f.WINDOW_UPDATE, 0, 0, (1 << 20).to_bytes(4, "big"))


def ours() -> int:
    buf = bytearray(WIRE)
    pos, end, seen = 0, len(buf), 0
    while end - pos >= 9:
        length = buf[pos] << 16 | buf[pos + 1] << 8 | buf[pos + 2]
        kind, flags = buf[pos + 3], buf[pos + 4]
        stream = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
        payload = bytes(buf[pos + 9 : pos + 9 + length])
        pos += 9 + length
        seen += kind + flags + stream + len(payload)
    out = []
    for i in range(CALLS):
        out.append(f.frame(f.HEADERS, f.END_HEADERS, 2 * i + 1, f.RESPONSE_HEADERS))
        out.append(f.frame(f.DATA, 0, 2 * i + 1, MSG))
        out.append(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 2 * i + 1, f.OK_TRAILERS))
    return seen + len(b"".join(out))


def theirs() -> int:
    view = memoryview(WIRE)
    pos, seen = 0, 0
    while len(view) - pos >= 9:
        frame, length = Frame.parse_frame_header(view[pos : pos + 9])
        frame.parse_body(view[pos + 9 : pos + 9 + length])
        pos += 9 + length
        seen += frame.type + len(frame.flags) + frame.stream_id + length
    out = []
    for i in range(CALLS):
        h = HeadersFrame(2 * i + 1, data=f.RESPONSE_HEADERS, flags=["END_HEADERS"])
        d = DataFrame(2 * i + 1, data=MSG)
        t = HeadersFrame(2 * i + 1, data=f.OK_TRAILERS, flags=["END_HEADERS", "END_STREAM"])
        out += [h.serialize(), d.serialize(), t.serialize()]
    return seen + len(b"".join(out))


def per_call(fn: object, rounds: int = 200) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.process_time()
        fn()  # type: ignore[operator]
        times.append((time.process_time() - t0) / CALLS * 1e6)
    return statistics.median(times)


def main() -> None:
    for fn in (ours, theirs):  # warm-up
        per_call(fn, 20)
    rows = [(per_call(ours), per_call(theirs)) for _ in range(5)]  # interleaved
    a = statistics.median(r[0] for r in rows)
    b = statistics.median(r[1] for r in rows)
    res = {"us_per_call_runtime_h2": a, "us_per_call_hyperframe": b, "hyperframe_over_ours": b / a}
    print(json.dumps(res, indent=2))
    out = ROOT / "bench" / "results" / "h2_frames.json"
    out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
