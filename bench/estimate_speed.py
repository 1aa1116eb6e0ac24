"""The prompt estimate's cost per prompt, this tree beside another checkout's, in one run.

``.venv/bin/python bench/estimate_speed.py --baseline-src DIR [--rounds 7]`` (DIR e.g. a
``git archive`` of an older commit): loads ``filters/estimate.py`` from both trees and times
``load_estimator(None).count`` (the heuristic, long prompts on a sample) on the tests' frozen
corpora (prose, Python source, JSON; tests/data) and the emulator's trace text (``b12w3`` words,
what ``bench/peers.py`` sends) at 3 KB, 15 KB and 300 KB. The two trees alternate within every
round (the machine is shared: medians of the rounds, and their ratio); the counts of both are
reported beside the whole-text count. JSON in ``bench/results/estimate_speed.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import timeit
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.emulator.tokenizer import trace_block_text  # noqa: E402

SIZES = (3_000, 15_000, 300_000)


def _module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def corpora() -> dict[str, str]:
    """The tests' frozen corpora (tests/data: prose, Python source, JSON) and trace text."""
    data = ROOT / "tests" / "data"
    out = {k: (data / f"estimate_{k}.txt").read_text() for k in ("prose", "code", "json")}
    out["trace"] = " ".join(trace_block_text(1000 + i, 512) for i in range(120))
    return out


def _seconds(count: Any, text: str, number: int) -> float:
    return min(timeit.repeat(lambda: count(text), number=number, repeat=3)) / number


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--baseline-src", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "estimate_speed.json")
    a = p.parse_args()
    trees = {
        "before": _module(a.baseline_src / "filters" / "estimate.py", "estimate_before"),
        "now": _module(ROOT / "filters" / "estimate.py", "estimate_now"),
    }
    rows = []
    for kind, source in corpora().items():
        for size in SIZES:
            text = source[:size]
            if len(text) < size:
                continue
            number = max(10, 1_000_000 // size)
            counts = {k: m.load_estimator(None).count for k, m in trees.items()}
            times: dict[str, list[float]] = {k: [] for k in trees}
            for r in range(a.rounds):
                order = list(trees) if r % 2 == 0 else list(reversed(trees))
                for k in order:
                    times[k].append(_seconds(counts[k], text, number) * 1e6)
            med = {k: statistics.median(v) for k, v in times.items()}
            row = {
                "corpus": kind,
                "chars": len(text),
                "us_before": round(med["before"], 1),
                "us_now": round(med["now"], 1),
                "speedup": round(med["before"] / med["now"], 2),
                "count_before": counts["before"](text),
                "count_now": counts["now"](text),
                "count_whole": trees["now"].HeuristicEstimator().count(text),
            }
            rows.append(row)
            print(
                f"{kind:6} {len(text):>7} chars: {row['us_before']:8.1f} → {row['us_now']:8.1f} µs"
                f" ({row['speedup']:.2f}x); counts {row['count_before']} → {row['count_now']}"
                f" (whole {row['count_whole']})",
                flush=True,
            )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"rounds": a.rounds, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
