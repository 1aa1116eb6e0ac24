"""Step times of a Llama-3.1-8B-shaped model on a real GPU: the numbers behind an emulator profile.

The emulator's profiles (``backends/profiles.py``) model one scheduler step as
``overhead + uncached prefill tokens / prefill_tok_s + decode_cost(batch)``. The
``llama-3.1-8b-h100`` profile fits a published sweep and *estimates* prefill. This script measures
both on the GPU it runs on, with the model's real shapes (32 layers, hidden 4096, 32 query heads
over 8 KV heads of 128, SwiGLU 14336, vocabulary 128256, bf16) and random weights:

* **prefill**: one chunk of N new tokens after P cached ones (causal attention aligned to the
  end, ``causal_lower_right``), for N up to the chunked-prefill size and P up to 32k;
* **decode**: one step of B streams, each attending to L cached tokens (K/V read from device
  memory every layer), captured in a CUDA graph as SGLang does for decode, plus the LM head;
* **KV capacity**: what SGLang's ``--mem-fraction-static`` leaves for the KV pool after weights.

It is not SGLang: no paged KV, no FlashInfer, no fused kernels, no scheduler. So the step times
bound SGLang's from above (its fused norms, activations and split-KV decode attention only make a
step shorter), and the bytes each step must read (weights + the batch's KV) over the card's
measured copy bandwidth bound them from below; docs/benchmarks.md ("A real GPU") gives both.

    python3 bench/gpu_profile.py --out results.json           # on a CUDA host (PyTorch only)
    python3 bench/gpu_profile.py --tiny --device cpu          # the same code path, tiny shapes

Each timing is the median of ``--reps`` runs between CUDA events, after warm-up; inputs are
random (never zeros). A correctness check first compares the grouped-query decode attention
with a float64 reference. Prints one JSON document (and writes it with ``--out``).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_model import TINY, Model, Shape, check_decode_attention


class Timer:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def median_ms(self, fn: Any, warmup: int, reps: int) -> float:
        for _ in range(warmup):
            fn()
        self.sync()
        times = []
        for _ in range(reps):
            if self.cuda:
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


def graph_median_ms(t: Timer, step: Any, reps: int) -> float:
    """``step`` captured in a CUDA graph (after warm-up on a side stream), its replays timed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    ms = t.median_ms(graph.replay, 3, reps)
    del graph
    return ms


def measure_prefill(
    m: Model, t: Timer, chunks: list[int], prefixes: list[int], reps: int
) -> list[dict[str, Any]]:
    s, dev = m.s, m.embed.device
    out = []
    for p in prefixes:
        kc = torch.randn(s.kv_heads, p, s.head_dim, device=dev, dtype=m.embed.dtype)
        vc = torch.randn(s.kv_heads, p, s.head_dim, device=dev, dtype=m.embed.dtype)
        for n in chunks:
            ids = torch.randint(0, s.vocab, (n,), device=dev)
            with torch.inference_mode():
                logits = m.prefill(ids, kc, vc)
                if not torch.isfinite(logits.float()).all():
                    raise SystemExit(f"prefill N={n} P={p}: non-finite logits")
                ms = t.median_ms(functools.partial(m.prefill, ids, kc, vc), 2, reps)
            out.append(
                {"chunk": n, "prefix": p, "ms": round(ms, 3), "tok_s": round(n / ms * 1e3, 1)}
            )
            print(f"prefill N={n:6d} P={p:6d}: {ms:8.2f} ms  {n / ms * 1e3:9.0f} tok/s", flush=True)
        del kc, vc
    return out


def measure_decode(
    m: Model,
    t: Timer,
    batches: list[int],
    contexts: list[int],
    reps: int,
    graphs: bool,
    max_kv_tokens: int,
) -> list[dict[str, Any]]:
    s, dev, dt = m.s, m.embed.device, m.embed.dtype
    out = []
    for length in contexts:
        for b in batches:
            if b * length > max_kv_tokens:  # the whole model's KV would not fit the pool
                print(f"decode B={b} L={length}: skipped ({b * length} KV tokens > "
                      f"{max_kv_tokens})", flush=True)  # fmt: skip
                continue
            kc = torch.randn(b, s.kv_heads, length, s.head_dim, device=dev, dtype=dt)
            vc = torch.randn(b, s.kv_heads, length, s.head_dim, device=dev, dtype=dt)
            ids = torch.randint(0, s.vocab, (b,), device=dev)
            pos = torch.full((b,), length, device=dev)
            with torch.inference_mode():
                nxt = m.decode(ids, pos, kc, vc)
                if not ((nxt >= 0) & (nxt < s.vocab)).all():
                    raise SystemExit(f"decode B={b} L={length}: token out of range")
                step = functools.partial(m.decode, ids, pos, kc, vc)
                ms = (
                    graph_median_ms(t, step, reps)
                    if graphs and t.cuda
                    else t.median_ms(step, 2, reps)
                )
            kv_read = b * length * s.kv_bytes_per_token()
            out.append({
                "batch": b, "context": length, "ms": round(ms, 4),
                "tok_s": round(b / ms * 1e3, 1), "kv_gb_read": round(kv_read / 1e9, 3),
            })  # fmt: skip
            print(
                f"decode  B={b:4d} L={length:6d}: {ms:8.3f} ms  {b / ms * 1e3:9.0f} tok/s",
                flush=True,
            )
            del kc, vc
            if t.cuda:
                torch.cuda.empty_cache()
    return out


def measure_mixed(
    m: Model, t: Timer, cases: list[tuple[int, int, int, int]], reps: int, graphs: bool
) -> list[dict[str, Any]]:
    """Each case (N, P, B, L): a mixed step (eager, as SGLang runs prefill) beside its prefill
    alone and its decode alone (in a CUDA graph, and eager), whose sum is what the emulator's
    model charges: is a mixed step cheaper than the sum?"""
    s, dev, dt = m.s, m.embed.device, m.embed.dtype
    out = []
    for n, p, b, length in cases:
        kc = torch.randn(s.kv_heads, p, s.head_dim, device=dev, dtype=dt)
        vc = torch.randn(s.kv_heads, p, s.head_dim, device=dev, dtype=dt)
        dk = torch.randn(b, s.kv_heads, length, s.head_dim, device=dev, dtype=dt)
        dv = torch.randn(b, s.kv_heads, length, s.head_dim, device=dev, dtype=dt)
        ids = torch.randint(0, s.vocab, (n,), device=dev)
        dec_ids = torch.randint(0, s.vocab, (b,), device=dev)
        dec_pos = torch.full((b,), length, device=dev)
        with torch.inference_mode():
            nxt = m.mixed(ids, kc, vc, dec_ids, dec_pos, dk, dv)
            if nxt.shape[0] != b + 1 or not ((nxt >= 0) & (nxt < s.vocab)).all():
                raise SystemExit(f"mixed N={n} P={p} B={b} L={length}: bad tokens")
            mixed = t.median_ms(functools.partial(m.mixed, ids, kc, vc, dec_ids, dec_pos, dk, dv),
                                2, reps)  # fmt: skip
            pre = t.median_ms(functools.partial(m.prefill, ids, kc, vc), 2, reps)
            step = functools.partial(m.decode, dec_ids, dec_pos, dk, dv)
            dec = t.median_ms(step, 2, reps)
            dec_graph = graph_median_ms(t, step, reps) if graphs and t.cuda else dec
        out.append({
            "chunk": n, "prefix": p, "batch": b, "context": length, "mixed_ms": round(mixed, 3),
            "prefill_ms": round(pre, 3), "decode_eager_ms": round(dec, 3),
            "decode_graph_ms": round(dec_graph, 3), "sum_ms": round(pre + dec_graph, 3),
            "mixed_over_sum": round(mixed / (pre + dec_graph), 3),
        })  # fmt: skip
        print(f"mixed   N={n:5d} P={p:5d} B={b:3d} L={length:5d}: {mixed:8.2f} ms; prefill "
              f"{pre:.2f} + decode {dec_graph:.2f} (graph; eager {dec:.2f}) = "
              f"{pre + dec_graph:.2f} ms", flush=True)  # fmt: skip
        del kc, vc, dk, dv
    return out


def fit_decode(points: list[dict[str, Any]]) -> dict[str, float]:
    """Least squares ms = base + per_seq * B + per_kv_token * B * L over every decode point."""
    rows = [[1.0, p["batch"], p["batch"] * p["context"]] for p in points]
    y = [p["ms"] for p in points]
    a = torch.tensor(rows, dtype=torch.float64)
    sol = torch.linalg.lstsq(a, torch.tensor(y, dtype=torch.float64)[:, None]).solution[:, 0]
    pred = a @ sol
    resid = (pred - torch.tensor(y, dtype=torch.float64)).abs() / torch.tensor(
        y, dtype=torch.float64
    )
    return {
        "base_ms": float(sol[0]),
        "per_seq_ms": float(sol[1]),
        "per_kv_token_ns": float(sol[2]) * 1e6,
        "max_rel_error": float(resid.max()),
    }


def kv_capacity(shape: Shape, weights_bytes: int, fractions: list[float]) -> dict[str, Any]:
    if not torch.cuda.is_available():
        return {}
    total = torch.cuda.get_device_properties(0).total_memory
    return {
        "total_memory_bytes": total,
        "weights_bytes": weights_bytes,
        "kv_tokens_at_mem_fraction": {
            str(f): int((total * f - weights_bytes) // shape.kv_bytes_per_token())
            for f in fractions
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (a CPU check of the code)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--chunks", type=int, nargs="+", default=[256, 1024, 2048, 4096, 8192])
    ap.add_argument("--prefixes", type=int, nargs="+", default=[0, 8192, 32768])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128, 192, 256])
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 12288])
    ap.add_argument("--mem-fraction", type=float, default=0.88,
                    help="decode points whose KV (all layers) exceeds what this share of the "
                    "GPU's memory holds after the weights are skipped, as SGLang could not run "
                    "them")  # fmt: skip
    ap.add_argument(
        "--mixed", nargs="*", default=[], metavar="N:P:B:L",
        help="mixed steps to time beside their parts (a prefill chunk of N after P cached, "
        "B decoding streams of L tokens)",
    )  # fmt: skip
    ap.add_argument("--skip-prefill-decode", action="store_true", help="only the mixed steps")
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args()
    dev = torch.device(a.device)
    dtype = torch.bfloat16
    shape = TINY if a.tiny else Shape()
    torch.backends.cuda.matmul.allow_tf32 = True
    t0 = time.time()
    result: dict[str, Any] = {"shape": asdict(shape), "params": shape.params(), "dtype": "bfloat16"}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(0)
        result["gpu"] = {"name": props.name, "sms": props.multi_processor_count,
                         "memory_bytes": props.total_memory}  # fmt: skip
    result["torch"] = torch.__version__
    result["decode_attention_rel_error"] = check_decode_attention(dev, dtype)
    model = Model(shape, dev, dtype, seed=1)
    weights = shape.params() * 2
    timer = Timer(dev)
    cap = kv_capacity(shape, weights, [0.8, 0.85, 0.88, 0.9, a.mem_fraction])
    if not a.skip_prefill_decode:
        result["prefill"] = measure_prefill(model, timer, a.chunks, a.prefixes, a.reps)
        max_kv = int(cap["kv_tokens_at_mem_fraction"][str(a.mem_fraction)]) if cap else 10**9
        result["decode"] = measure_decode(
            model, timer, a.batches, a.contexts, a.reps, not a.no_graphs, max_kv
        )
        result["decode_fit"] = fit_decode(result["decode"])
    cases = [tuple(int(x) for x in c.split(":")) for c in a.mixed]
    if cases:
        result["mixed"] = measure_mixed(
            model,
            timer,
            cases,
            a.reps,
            not a.no_graphs,  # type: ignore[arg-type]
        )
    result["kv_capacity"] = cap
    result["seconds"] = round(time.time() - t0, 1)
    text = json.dumps(result, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
