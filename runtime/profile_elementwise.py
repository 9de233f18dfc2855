"""The elementwise rows of a kernel table (runtime/profile_kernels.py): RMSNorm, RoPE, SiLU x up,
the residual add, argmax and the KV-cache write, each called as the runtime calls it (the Triton
kernels where mode.fuse_norm_rope, mode.fuse_epilogues and mode.split_argmax put them, torch's
otherwise)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from cbsim.config.schema import CbsimConfig


def dtype_of(cfg: CbsimConfig) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[
        cfg.model.dtype
    ]


def _elementwise(cfg: CbsimConfig, dev: torch.device) -> dict[str, Callable]:
    """Per op: (n, k, make(rows) -> call) as the runtime runs it."""
    m, dt = cfg.model, dtype_of(cfg)
    h, hq, hkv, d, inter = (
        m.hidden_size,
        m.num_heads,
        m.num_kv_heads,
        m.head_dim,
        m.intermediate_size,
    )
    triton = dev.type == "cuda" and cfg.mode.fuse_norm_rope
    if triton:
        from .kernels.fused_elementwise import apply_rope, rms_norm
    w = torch.ones(h, dtype=dt, device=dev)

    def norm(r):
        x = torch.randn(r, h, dtype=dt, device=dev)
        if triton:
            return lambda: rms_norm(x, w, 1e-5)
        return lambda: (
            w * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(dt)
        )

    def rope(r):
        q, k, _ = _qkv_views(r, hq, hkv, d, dt, dev)
        cos = torch.randn(1, r, d, dtype=dt, device=dev)
        if triton:
            return lambda: apply_rope(q, k, cos, cos)
        half = d // 2
        rot = lambda t: torch.cat((-t[..., half:], t[..., :half]), -1)  # noqa: E731
        c = cos[:, None]
        return lambda: (q * c + rot(q) * c, k * c + rot(k) * c)

    def silu(r):
        gu = _gate_up(r, inter, dt, dev)
        return lambda: F.silu(gu[..., :inter]) * gu[..., inter:]

    def add(r):
        a, b = (torch.randn(1, r, h, dtype=dt, device=dev) for _ in range(2))
        return lambda: a + b

    def argmax(r):
        logits = torch.randn(r, m.vocab_size, dtype=dt, device=dev)
        return lambda: logits.argmax(-1)

    def kv_write(r):
        kc, vc, key, slots = _kv_operands(r, hkv, d, dt, dev)
        return lambda: (kc.index_copy_(0, slots, key), vc.index_copy_(0, slots, key))

    ops = {
        "rms_norm": (h, 0, norm),
        "rope": ((hq + hkv) * d, d, rope),
        "silu_mul": (inter, 0, silu),
        "add": (h, 0, add),
        "argmax": (m.vocab_size, 0, argmax),
        "kv_write": (2 * hkv * d, d, kv_write),
    }
    if dev.type == "cuda" and cfg.mode.fuse_epilogues:
        ops |= _fused_epilogues(h, hkv, d, inter, dt, dev)
    if dev.type == "cuda" and cfg.mode.rope_in_kv_write():
        ops["rope_kv_write"] = ((hq + 2 * hkv) * d, d, partial(_rope_kv, hq, hkv, d, dt, dev))
    if dev.type == "cuda" and cfg.mode.split_argmax:
        ops["argmax_split"] = (m.vocab_size, 0, partial(_argmax_split, m.vocab_size, dt, dev))
    return ops


def _argmax_split(vocab: int, dt, dev, r: int):
    """mode.split_argmax's two kernels, into an output as the runner's."""
    from .kernels.sampling import argmax_rows

    logits = torch.randn(r, vocab, dtype=dt, device=dev)
    out = torch.empty(r, dtype=torch.int64, device=dev)
    return lambda: argmax_rows(logits, out)


def _fused_epilogues(h: int, hkv: int, d: int, inter: int, dt, dev) -> dict[str, tuple]:
    """mode.fuse_epilogues' one-kernel SiLU x up and K/V write (the unfused rows stay, for
    recordings of the unfused build)."""
    from .kernels.fused_epilogues import kv_write, silu_mul

    def silu(r):
        gu = _gate_up(r, inter, dt, dev)
        return lambda: silu_mul(gu)

    def write(r):
        kc, vc, key, slots = _kv_operands(r, hkv, d, dt, dev)
        return lambda: kv_write(key, key, kc, vc, slots)

    return {"silu_mul_fused": (inter, 0, silu), "kv_write_fused": (2 * hkv * d, d, write)}


def _rope_kv(hq: int, hkv: int, d: int, dt, dev, r: int):
    """mode.fuse_rope_kv's one kernel: q and k rotated, k and v into their cache slots."""
    from .kernels.rope_kv import rope_kv_write

    q, k, v = _qkv_views(r, hq, hkv, d, dt, dev)
    cos = torch.randn(1, r, d, dtype=dt, device=dev)
    kc, vc, _, slots = _kv_operands(r, hkv, d, dt, dev)
    return lambda: rope_kv_write(q, k, v, (cos, cos), kc, vc, slots)


def _qkv_views(r: int, hq: int, hkv: int, d: int, dt, dev) -> tuple[torch.Tensor, ...]:
    """q, k and v [1, heads, r, d] as a layer sees them: views of one fused projection output."""
    qkv = torch.randn(1, r, (hq + 2 * hkv) * d, dtype=dt, device=dev)
    q = qkv[..., : hq * d].view(1, r, hq, d).transpose(1, 2)
    k = qkv[..., hq * d : (hq + hkv) * d].view(1, r, hkv, d).transpose(1, 2)
    return q, k, qkv[..., (hq + hkv) * d :].view(1, r, hkv, d).transpose(1, 2)


def _gate_up(r: int, inter: int, dt, dev) -> torch.Tensor:
    """A fused gate/up GEMM's output for ``r`` tokens."""
    return torch.randn(1, r, 2 * inter, dtype=dt, device=dev)


def _kv_operands(r: int, hkv: int, d: int, dt, dev) -> tuple[torch.Tensor, ...]:
    """K and V caches with room for ``r`` tokens, one token's K (also used as V), their slots."""
    kc = torch.zeros(r + 16, hkv, d, dtype=dt, device=dev)
    key = torch.randn(r, hkv, d, dtype=dt, device=dev)
    return kc, torch.zeros_like(kc), key, torch.randperm(r, device=dev)


def profile_elementwise(cfg: CbsimConfig, grid, timer, dt, dev, out: list) -> None:
    """Every elementwise op at ``grid.elementwise_rows`` (a ProfileGrid; ``timer`` a Timer)."""
    for op, (n, k, make) in _elementwise(cfg, dev).items():
        for rows in grid.elementwise_rows:
            if op.startswith("argmax") and rows > grid.lm_head_rows_max:
                break
            out.append((op, n, k, 0, rows, 0, timer([make(rows)] * 4)))
