"""Measure (and fit) the prompt-token heuristic against a real BPE tokenizer on real text.

Corpora found on any Debian machine with this project installed: English prose (the licence
texts in /usr/share/common-licenses and the Markdown docs shipped in site-packages), Python
source (the standard library), and JSON. Samples of ~1,500 characters, like prompts. Half of the
samples fit the coefficients (least squares over the heuristic's features), the other half
measure the error of both the shipped defaults and the fit.

``.venv/bin/python bench/filters_estimate.py --tokenizer path/to/tokenizer.json``
(needs the ``tokenizers`` extra; any Hugging Face tokenizer.json works).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import sysconfig
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from filters.estimate import (  # noqa: E402
    _DIGITS,
    _LONG_WORD,
    _NEWLINES,
    _NON_ASCII,
    _SYMBOL,
    _WORD,
    HeuristicEstimator,
    TokenizerEstimator,
)

SAMPLE = 1500


def corpora() -> dict[str, list[str]]:
    site = Path(sysconfig.get_paths()["purelib"])
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    prose = [
        p.read_text(errors="ignore")
        for p in sorted(Path("/usr/share/common-licenses").glob("*"))
        if p.is_file()
    ]
    prose += [p.read_text(errors="ignore") for p in sorted(site.rglob("*.md"))[:200]]
    code = [p.read_text(errors="ignore") for p in sorted(stdlib.glob("*.py"))[:120]]
    data = [p.read_text(errors="ignore") for p in sorted(site.rglob("*.json"))[:200]]
    return {"prose": prose, "code": code, "json": data}


def samples(texts: list[str], rng: random.Random, n: int) -> list[str]:
    out = []
    for t in texts:
        for i in range(0, max(0, len(t) - SAMPLE), SAMPLE * 3):
            out.append(t[i : i + SAMPLE])
    rng.shuffle(out)
    return out[:n]


def features(text: str, free: int = 6) -> list[float]:
    d = 3
    return [
        len(_WORD.findall(text)),
        sum(len(w) - free for w in _LONG_WORD.findall(text)),
        sum(-(-len(r) // d) for r in _DIGITS.findall(text)),
        len(_SYMBOL.findall(text)) - len(_NON_ASCII.findall(text)),
        len(_NON_ASCII.findall(text)),
        len(_NEWLINES.findall(text)),
    ]


def errors(est: list[int], true: list[int]) -> dict[str, float]:
    e = np.array(est, dtype=float)
    t = np.array(true, dtype=float)
    rel = (e - t) / t
    return {
        "mean_abs_pct": float(np.mean(np.abs(rel)) * 100),
        "p90_abs_pct": float(np.percentile(np.abs(rel), 90) * 100),
        "bias_pct": float(np.mean(rel) * 100),
        "underestimates_pct": float(np.mean(rel < 0) * 100),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--per-corpus", type=int, default=400)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "filters_estimate.json")
    ns = p.parse_args()
    tok = TokenizerEstimator(ns.tokenizer)
    heur = HeuristicEstimator()
    rng = random.Random(7)
    train_x, train_y, test = [], [], {}
    for name, texts in corpora().items():
        ss = samples(texts, rng, ns.per_corpus)
        half = len(ss) // 2
        for s in ss[:half]:
            train_x.append(features(s))
            train_y.append(tok.count(s))
        test[name] = ss[half:]
    coef, *_ = np.linalg.lstsq(np.array(train_x), np.array(train_y, dtype=float), rcond=None)
    result: dict[str, object] = {
        "tokenizer": ns.tokenizer,
        "fitted": [round(float(c), 3) for c in coef],
    }
    for name, ss in test.items():
        true = [tok.count(s) for s in ss]
        shipped = [heur.count(s) for s in ss]
        fitted = [max(1, round(float(np.dot(coef, features(s))))) for s in ss]
        chars = [round(len(s) / 4) for s in ss]
        result[name] = {
            "samples": len(ss),
            "shipped_heuristic": errors(shipped, true),
            "fitted_heuristic": errors(fitted, true),
            "chars_div_4": errors(chars, true),
        }
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
