"""A Llama-3.1-8B-shaped model in plain PyTorch for bench/gpu_profile.py: the real shapes (or
tiny ones for a CPU check), random weights, and one forward pass per kind of scheduler step:
a prefill chunk after cached tokens, a decode step of a batch, and a mixed step of both.

Attention is PyTorch's ``scaled_dot_product_attention``: causal and aligned to the end for a
chunk (``causal_lower_right``), and for decode each KV head's query heads as the query rows of
one call (grouped-query attention without copying K/V per head; checked against float64 by
:func:`check_decode_attention`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

__all__ = ["TINY", "Model", "Shape", "check_decode_attention", "decode_attention"]


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
