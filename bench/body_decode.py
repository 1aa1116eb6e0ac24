"""The request body's decode, side by side in one process: the standard library's reading
(``filters.bodies._decode_checked``, the code before issue 37) against ``decode_json``
(msgspec first, the standard library only for what msgspec refuses), on chat bodies of 3, 71 and
300 KB cut from this repository's docs (as ``bench/large_prompts.py`` builds them), their
non-ASCII text sent as ``\\uXXXX`` escapes (Python's ``json.dumps`` default) and as raw UTF-8.
CPU time per decode, the median of ``--repeat`` runs.

``.venv/bin/python bench/body_decode.py [--repeat 30]``: a table on stdout and
``bench/results/body_decode.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from filters.bodies import _decode_checked, decode_json  # noqa: E402

DOCS = ("benchmarks.md", "operations.md", "policy.md")


def body(corpus: str, kb: int, ascii_only: bool, rng: random.Random) -> bytes:
    size = kb * 1000 - 120
    start = rng.randrange(0, len(corpus) - size)
    msg = {"role": "user", "content": corpus[start : start + size]}
    data = {"model": "llama-3.1-8b", "messages": [msg], "max_tokens": 1}
    return json.dumps(data, ensure_ascii=ascii_only).encode()


def median_ms(fn: Callable[[bytes], Any], data: bytes, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn(data)
        times.append(time.process_time() - t0)
    times.sort()
    return times[len(times) // 2] * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--sizes", type=int, nargs="+", default=[3, 71, 300])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "body_decode.json")
    a = ap.parse_args()
    corpus = "".join((ROOT / "docs" / name).read_text() for name in DOCS)
    rng = random.Random(1)
    rows = []
    for kb in a.sizes:
        for ascii_only in (True, False):
            data = body(corpus, kb, ascii_only, rng)
            assert decode_json(data) == _decode_checked(data)
            old, new = (median_ms(fn, data, a.repeat) for fn in (_decode_checked, decode_json))
            rows.append({"kb": kb, "escaped": ascii_only, "bytes": len(data),
                         "stdlib_ms": round(old, 3), "msgspec_first_ms": round(new, 3),
                         "ratio": round(new / old, 2) if old else None})  # fmt: skip
    print("| body | non-ASCII as | stdlib ms | msgspec first ms | ratio |\n|---|---|---|---|---|")
    for r in rows:
        how = "\\u escapes" if r["escaped"] else "UTF-8"
        print(
            f"| {r['kb']} KB | {how} | {r['stdlib_ms']} | {r['msgspec_first_ms']} | {r['ratio']} |"
        )
    a.out.write_text(json.dumps({"rows": rows, "load_average": os.getloadavg()}, indent=1) + "\n")


if __name__ == "__main__":
    main()
