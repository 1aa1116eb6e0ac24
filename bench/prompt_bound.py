"""The prompt side of a reservation against real tokenizers: is it a bound, how loose, how dear?

``.venv/bin/python bench/prompt_bound.py [--baseline-rev REV] [--rounds 5]``

Tokenizers: Llama 3 and Qwen2.5 (``tokenizer.json`` and chat template, fetched once into
``bench/.models/`` by ``bench/model_tokenizer.py``'s ``fetch``), applied as SGLang applies them
(chat/tokenizer.py). Each text is one user message of a chat request; "real" is the
rendered prompt's token count.

1. **Accuracy** per kind of text (English prose, dense Python, JSON, Chinese, Japanese, emoji,
   long digit runs, spaced ASCII symbols, and a prompt crafted against the old sampler: cheap
   words wherever its 64 windows look, Chinese text between them): the reservation's prompt
   tokens (:func:`filters.plugins.tokens.plugin.estimate_prompt`) now (the byte bound) and before
   (``REV``'s estimator: the heuristic, sampled past 16 KiB), each over the real count. A bound
   must be >= 1 everywhere.
2. **Cost** of counting one prompt at 3 KB, 71 KB and 300 KB: the byte bound, the old sampled
   heuristic, and an exact count with the model's tokenizer (what a filter server started with
   ``--tokenizer`` does), medians of ``--rounds`` rounds, all in one run; and the learned
   quantile's read and write (filters/output_lengths.py).

Writes ``bench/results/prompt_bound.json`` and ``.md``; docs/quotas.md cites them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from chat.tokenizer import HfChatTokenizer  # noqa: E402
from filters.bodies import parse_request  # noqa: E402
from filters.estimate import ByteBound, TokenizerEstimator  # noqa: E402
from filters.metrics import FilterMetrics  # noqa: E402
from filters.output_lengths import OutputLengths  # noqa: E402
from filters.plugins.tokens import plugin as tokens  # noqa: E402
from filters.services import default_services  # noqa: E402
from policy import load_policy  # noqa: E402

MODELS = ("llama3", "qwen2_5")
SIZES = (3_000, 71_000, 300_000)
_ZH = ("堰是一种低矮的水坝，用来抬高上游水位并保持河流流量稳定。在灌溉系统中，工程师根据季节调整闸门，"
       "让下游农田获得足够的水，同时避免洪水。")  # fmt: skip
_JA = ("堰は川の流れを穏やかに保つための低いダムです。技術者は季節ごとに水門を調整し、"
       "下流の田畑に十分な水を送りながら洪水を防ぎます。")  # fmt: skip


def _fill(piece: str, size: int) -> str:
    return (piece * (size // max(1, len(piece)) + 1))[:size]


def _symbols(rng: random.Random, size: int) -> str:
    return " ".join(rng.choice("{}()[];,.=+-*/<>!?:|&^%$#@~`") for _ in range(size // 2))[:size]


def _digits(rng: random.Random, size: int) -> str:
    out: list[str] = []
    while sum(map(len, out)) < size:
        out.append("".join(rng.choice("0123456789") for _ in range(rng.randint(20, 200))))
    return " ".join(out)[:size]


def _emoji(rng: random.Random, size: int) -> str:
    pool = ["😀", "🚀", "👩‍💻", "🇺🇳", "❤️", "🎉", "ok", "yes", "👍🏽", "🔥"]
    return "".join(rng.choice(pool) for _ in range(size))[: size // 3]


def crafted(dense: int = 400) -> str:
    """Cheap words where the old sampler's 64 windows (256 characters at every 64th of the
    text, moved to whitespace) looked, ``dense`` Chinese characters between them."""
    cheap = " " * 600  # covers a window (whitespace costs the heuristic nothing)
    return "".join(cheap + _fill(_ZH, dense) for _ in range(64))


def texts(size: int) -> dict[str, str]:
    data = ROOT / "tests" / "data"
    rng = random.Random(36)
    out = {k: (data / f"estimate_{k}.txt").read_text()[:size] for k in ("prose", "code", "json")}
    out["chinese"] = _fill(_ZH, size // 3)  # ~3 bytes a character
    out["japanese"] = _fill(_JA, size // 3)
    out["emoji"] = _emoji(rng, size)
    out["digits"] = _digits(rng, size)
    out["spaced_symbols"] = _symbols(rng, size)
    return out


def _module(src: str, name: str) -> ModuleType:
    tmp = Path(tempfile.mkdtemp()) / f"{name}.py"
    tmp.write_text(src)
    spec = importlib.util.spec_from_file_location(name, tmp)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def baseline(rev: str) -> Any:
    """``REV``'s estimator (its ``load_estimator(None)``) and its chat overhead (4 a message
    + 3)."""
    src = subprocess.run(["git", "show", f"{rev}:filters/estimate.py"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    return _module(src, "estimate_baseline").load_estimator(None)


def _body(text: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


def accuracy(models: dict[str, HfChatTokenizer], old: Any) -> dict[str, Any]:
    services = default_services(load_policy(ROOT / "examples" / "mesh.yaml"), lambda: 0.0)
    cases = {**texts(3_000), "crafted": crafted()}
    rows: dict[str, Any] = {}
    for kind, text in cases.items():
        body = _body(text)
        req = parse_request("chat", json.dumps(body).encode())
        bound = tokens.estimate_prompt(req, services)
        before = max(1, old.count(req.prompt_text) + 4 + 3)
        row: dict[str, Any] = {"bytes": len(text.encode()), "bound": bound, "before": before}
        for name, tok in models.items():
            real = len(tok.encode(tok.render_request(body)))
            row[name] = {"real": real, "bound_x": round(bound / real, 2),
                         "before_x": round(before / real, 3)}  # fmt: skip
        rows[kind] = row
    return rows


def _time(fn: Any, arg: Any, number: int) -> float:
    return min(timeit.repeat(lambda: fn(arg), number=number, repeat=3)) / number


def cost(exact: TokenizerEstimator, old: Any, rounds: int) -> dict[str, Any]:
    prose = (ROOT / "tests" / "data" / "estimate_prose.txt").read_text()
    out: dict[str, Any] = {}
    bound = ByteBound()
    for size in SIZES:
        for kind, text in (("prose", prose[:size]), ("chinese", _fill(_ZH, size // 3))):
            times: dict[str, list[float]] = {"bound": [], "before": [], "exact": []}
            number = max(1, 300_000 // size)
            for _ in range(rounds):  # alternate within each round: the machine is shared
                times["bound"].append(_time(bound.count, text, number * 20))
                times["before"].append(_time(old.count, text, number))
                times["exact"].append(_time(exact.count, text, max(1, number // 10)))
            out[f"{kind}_{size}"] = {
                k: round(statistics.median(v) * 1e6, 2) for k, v in times.items()
            }  # µs
    lengths = OutputLengths(clock=lambda: 0.0)
    for i in range(1000):
        lengths.observe(f"t{i % 50}", "m", 10 + i % 90)
    metrics = FilterMetrics()
    out["quantile_us"] = round(_time(lambda _: lengths.quantile("t7", "m", 0.95, 20), None,
                                     20_000) * 1e6, 2)  # fmt: skip
    out["observe_us"] = round(_time(lambda _: lengths.observe("t7", "m", 42), None, 20_000)
                              * 1e6, 2)  # fmt: skip
    out["metric_inc_us"] = round(_time(lambda _: metrics.reservations.labels("tenant").inc(),
                                       None, 20_000) * 1e6, 2)  # fmt: skip
    return out


def report(r: dict[str, Any]) -> str:
    lines = ["# Prompt bound (issue 36)", "",
             "Reserved prompt tokens over the real count (rendered chat prompt), per kind of "
             "text (~3 KB each); `now` is the byte bound, `before` the sampled heuristic.", "",
             "| text | bytes | " + " | ".join(f"{m} real | now | before" for m in MODELS) + " |",
             "|---|---:|" + "---:|---:|---:|" * len(MODELS)]  # fmt: skip
    for kind, row in r["accuracy"].items():
        cells = [f"{row[m]['real']} | {row[m]['bound_x']}x | {row[m]['before_x']}x" for m in MODELS]
        lines.append(f"| {kind} | {row['bytes']} | " + " | ".join(cells) + " |")
    lines += ["", "Cost of one count, µs (medians of rounds; shared 2-core box):", "",
              "| text | byte bound | before (sampled heuristic) | exact (Llama 3 tokenizer) |",
              "|---|---:|---:|---:|"]  # fmt: skip
    for key, row in r["cost"].items():
        if isinstance(row, dict):
            lines.append(f"| {key} | {row['bound']} | {row['before']} | {row['exact']} |")
    c = r["cost"]
    lines += ["", f"Learned quantile: read {c['quantile_us']} µs, write {c['observe_us']} µs; "
              f"the reservation counter {c['metric_inc_us']} µs."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--baseline-rev", default="ba6bd88")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "prompt_bound.json")
    a = p.parse_args()
    from model_tokenizer import fetch

    dirs = {m: fetch(m) for m in MODELS}
    models = {m: HfChatTokenizer.load(d) for m, d in dirs.items()}
    old = baseline(a.baseline_rev)
    result = {
        "accuracy": accuracy(models, old),
        "cost": cost(TokenizerEstimator(dirs["llama3"] / "tokenizer.json"), old, a.rounds),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    a.out.with_suffix(".md").write_text(report(result))
    print(report(result))


if __name__ == "__main__":
    main()
