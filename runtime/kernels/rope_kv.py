"""RoPE and the K/V cache write as one kernel (``mode.fuse_rope_kv``).

The rope kernel (``mode.fuse_norm_rope``) and the K/V write (``mode.fuse_epilogues``) are a few
microseconds of tiny work each, in every layer of every step, and each is a graph node. With
the rotation deferred to the attention function (runtime/kernels/deferred_rope.py), one kernel
rotates q, rotates k, and writes k and v into their slots: the same bits the two kernels made,
so the tokens are too. A piecewise step, whose graph piece ends at the attention, rotates before
the cut (``rotate``).
"""

from __future__ import annotations

import torch

from .fused_elementwise import apply_rope, triton_kernels


def rotate(q: torch.Tensor, k: torch.Tensor, pending) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k rotated by the rope kernel alone (a piecewise step's cut)."""
    return (q, k) if pending is None else apply_rope(q, k, *pending)


def rope_kv_write(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos_sin: tuple[torch.Tensor, torch.Tensor],
    k_flat: torch.Tensor,
    v_flat: torch.Tensor,
    slots: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rotated q, rotated k) for q [1, Hq, S, D], k and v [1, Hkv, S, D]; the rotated k and v
    written at ``slots`` of the flat caches [slots, Hkv, D]. One kernel."""
    cos, sin = cos_sin
    _, hq, s, d = q.shape
    hkv = k.shape[1]
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    if s == 0:
        return qo, ko
    hb = 8
    nqb = -(-hq // hb)
    triton_kernels()._rope_kv_write_kernel[(s, nqb + -(-hkv // hb))](
        q, k, v, cos, sin, qo, ko, k_flat, v_flat, slots, hq, hkv,
        q.stride(1), q.stride(2), k.stride(1), k.stride(2), v.stride(1), v.stride(2),
        qo.stride(1), qo.stride(2), ko.stride(1), ko.stride(2), cos.stride(1), sin.stride(1),
        HALF=d // 2, HB=hb, NQB=nqb, num_warps=1, enable_fp_fusion=False,
    )  # fmt: skip
    return qo, ko


def rope_kv_ok(
    k: torch.Tensor, v: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor
) -> bool:
    """Whether rope_kv_write takes these: contiguous head dims, dense flat caches."""
    return (
        k.stride(-1) == 1
        and v.stride(-1) == 1
        and k_flat.is_contiguous()
        and v_flat.is_contiguous()
        and k.dtype == v.dtype
        and v.shape == k.shape
    )
