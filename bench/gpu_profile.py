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
import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right


@dataclass(frozen=True)
class Shape:
    layers: int = 32
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    ffn: int = 14336
    vocab: int = 128256

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    def kv_bytes_per_token(self, elem: int = 2) -> int:
        return self.layers * self.kv_heads * self.head_dim * 2 * elem

    def params(self) -> int:
        per_layer = (
            self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim  # q, k, v
            + self.heads * self.head_dim * self.hidden  # o
            + 3 * self.hidden * self.ffn  # gate, up, down
            + 2 * self.hidden  # two RMSNorms
        )
        return self.layers * per_layer + 2 * self.vocab * self.hidden + self.hidden


TINY = Shape(layers=2, hidden=256, heads=8, kv_heads=2, head_dim=32, ffn=512, vocab=1000)


class Model:
    """Random bf16 weights in the model's shapes; a forward pass in plain PyTorch ops."""

    def __init__(self, shape: Shape, device: torch.device, dtype: torch.dtype, seed: int) -> None:
        g = torch.Generator(device=device).manual_seed(seed)
        s = shape

        def w(*dims: int) -> torch.Tensor:
            t = torch.randn(*dims, device=device, dtype=dtype, generator=g)
            return t.mul_(1.0 / math.sqrt(dims[-1]))

        self.s = s
        self.embed = w(s.vocab, s.hidden)
        self.lm_head = w(s.vocab, s.hidden)
        self.final_norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.layers = [
            {
                "qkv": w((s.heads + 2 * s.kv_heads) * s.head_dim, s.hidden),
                "o": w(s.hidden, s.heads * s.head_dim),
                "gate_up": w(2 * s.ffn, s.hidden),
                "down": w(s.hidden, s.ffn),
                "n1": torch.ones(s.hidden, device=device, dtype=dtype),
                "n2": torch.ones(s.hidden, device=device, dtype=dtype),
            }
            for _ in range(s.layers)
        ]
        half = s.head_dim // 2
        self.inv_freq = 1.0 / (500000.0 ** (torch.arange(half, device=device) / half))

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Rotary embedding on [..., T, D] at positions ``pos`` [T] (or [B, 1] for decode)."""
        ang = pos.to(torch.float32)[..., None] * self.inv_freq
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def mlp(self, h: torch.Tensor, lw: dict[str, torch.Tensor]) -> torch.Tensor:
        gate, up = (F.rms_norm(h, (self.s.hidden,), lw["n2"]) @ lw["gate_up"].T).chunk(2, dim=-1)
        return h + (F.silu(gate) * up) @ lw["down"].T

    def _prefill_attention(
        self, qkv: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        """Attention of ``n`` new rows ([n, (H + 2 KVH) D]) over ``P`` cached tokens and
        themselves, causal and aligned to the end; returns [n, H D]."""
        s, n, p = self.s, qkv.shape[0], k_cache.shape[1]
        q, k, v = qkv.split(
            [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], -1
        )
        q = self.rope(q.view(n, s.heads, s.head_dim).transpose(0, 1), pos)
        k = self.rope(k.view(n, s.kv_heads, s.head_dim).transpose(0, 1), pos)
        v = v.view(n, s.kv_heads, s.head_dim).transpose(0, 1)
        if p:
            k, v = torch.cat((k_cache, k), 1), torch.cat((v_cache, v), 1)
        k = k.repeat_interleave(s.group, 0)
        v = v.repeat_interleave(s.group, 0)
        if p:
            mask = causal_lower_right(n, p + n)
            a = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask)
        else:
            a = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)
        return a[0].transpose(0, 1).reshape(n, -1)

    def _decode_attention(
        self, qkv: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        """One new row per stream ([B, (H + 2 KVH) D]) over its ``L`` cached tokens; [B, H D]."""
        s, b = self.s, qkv.shape[0]
        q = qkv[:, : s.heads * s.head_dim].view(b, s.heads, 1, s.head_dim)
        q = self.rope(q, pos[:, None, None])
        return decode_attention(q, k_cache, v_cache, s.group).reshape(b, -1)

    def prefill(
        self, ids: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        """One chunk of ``ids`` [N] after ``P`` cached tokens (``k_cache``: [KVH, P, D], shared by
        every layer); returns the next-token logits of the chunk's last position."""
        s, n, p = self.s, ids.shape[0], k_cache.shape[1]
        pos = torch.arange(p, p + n, device=ids.device)
        h = self.embed[ids]
        for lw in self.layers:
            qkv = F.rms_norm(h, (s.hidden,), lw["n1"]) @ lw["qkv"].T
            h = h + self._prefill_attention(qkv, pos, k_cache, v_cache) @ lw["o"].T
            h = self.mlp(h, lw)
        last = F.rms_norm(h[-1:], (s.hidden,), self.final_norm)
        return last @ self.lm_head.T

    def decode(
        self, ids: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        """One decode step of ``B`` streams (``ids``, ``pos``: [B]); ``k_cache``/``v_cache``:
        [B, KVH, L, D], read by every layer. Grouped-query attention as a 4-row query per KV
        head (``decode_attention``). Returns the greedy next tokens [B]."""
        s = self.s
        h = self.embed[ids]
        for lw in self.layers:
            qkv = F.rms_norm(h, (s.hidden,), lw["n1"]) @ lw["qkv"].T
            h = h + self._decode_attention(qkv, pos, k_cache, v_cache) @ lw["o"].T
            h = self.mlp(h, lw)
        logits = F.rms_norm(h, (s.hidden,), self.final_norm) @ self.lm_head.T
        return logits.argmax(-1)

    def mixed(
        self,
        ids: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        dec_ids: torch.Tensor,
        dec_pos: torch.Tensor,
        dec_k: torch.Tensor,
        dec_v: torch.Tensor,
    ) -> torch.Tensor:
        """One mixed step (SGLang's mixed chunked prefill): a prefill chunk and a decode batch
        share every projection and MLP (the weights are read once); attention stays per part.
        Returns the greedy next tokens of the chunk's last position and of every stream."""
        s, n, p = self.s, ids.shape[0], k_cache.shape[1]
        pos = torch.arange(p, p + n, device=ids.device)
        h = self.embed[torch.cat((ids, dec_ids))]
        for lw in self.layers:
            qkv = F.rms_norm(h, (s.hidden,), lw["n1"]) @ lw["qkv"].T
            a = torch.cat((
                self._prefill_attention(qkv[:n], pos, k_cache, v_cache),
                self._decode_attention(qkv[n:], dec_pos, dec_k, dec_v),
            ))  # fmt: skip
            h = h + a @ lw["o"].T
            h = self.mlp(h, lw)
        rows = F.rms_norm(h[n - 1 :], (s.hidden,), self.final_norm)
        return (rows @ self.lm_head.T).argmax(-1)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int) -> torch.Tensor:
    """q [B, H, 1, D] over k, v [B, KVH, L, D] with H = KVH * group: each KV head's ``group``
    query heads become the query rows of one attention call (no K/V copied per head)."""
    b, h, _, d = q.shape
    qg = q.view(b, h // group, group, d)
    out = F.scaled_dot_product_attention(qg, k, v)
    return out.reshape(b, h, 1, d)


def check_decode_attention(device: torch.device, dtype: torch.dtype) -> float:
    """Relative error of :func:`decode_attention` against float64 attention per head."""
    g = torch.Generator(device=device).manual_seed(7)
    b, kvh, group, length, d = 3, 4, 4, 300, 64
    q = torch.randn(b, kvh * group, 1, d, device=device, generator=g).to(dtype)
    k = torch.randn(b, kvh, length, d, device=device, generator=g).to(dtype)
    v = torch.randn(b, kvh, length, d, device=device, generator=g).to(dtype)
    got = decode_attention(q, k, v, group).double()
    kr, vr = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    w = torch.softmax(q.double() @ kr.transpose(-1, -2) / math.sqrt(d), -1)
    ref = w @ vr
    err = float((got - ref).norm() / ref.norm())
    if not math.isfinite(err) or err > 2e-2:
        raise SystemExit(f"decode attention check failed: relative error {err}")
    return err


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
