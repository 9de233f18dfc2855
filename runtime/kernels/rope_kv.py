"""RoPE and the K/V cache write as one kernel (``mode.fuse_rope_kv``).

transformers' attention rotates q and k (``apply_rotary_pos_emb``, one Triton kernel with
``mode.fuse_norm_rope``) and hands them to the attention function, which writes k and v into the
paged cache (one more kernel with ``mode.fuse_epilogues``). Both are a few microseconds of tiny
work in every layer of every step, and each is a graph node. Here the rotation waits: inside a
runtime layer (``deferred``, entered by the fused layer forward) the rotary wrapper hands q and k
back unrotated and leaves cos/sin here (``defer``); the attention function takes them
(``take``) and one kernel rotates q, rotates k, and writes k and v into their slots. The
rotated q and k are the same bits the two kernels made, so the tokens are too.

Outside a runtime layer (transformers' own generate, another attention function) nothing is
deferred. A piecewise step, whose graph piece ends at the attention, rotates before the cut
(``rotate``).
"""

from __future__ import annotations

import torch

from . import fused_elementwise as fe  # a module reference: fused_elementwise imports this one


class _Deferred:
    """This thread's pending rotation: armed inside a runtime layer, cos/sin once deferred."""

    armed = False
    cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None


_STATE = _Deferred()


def arm(on: bool) -> None:
    """Let the rotary wrapper defer the rotation to the attention function (a runtime layer
    arms it around its attention, and disarms it after, even on an error)."""
    _STATE.armed, _STATE.cos_sin = on, None


def defer(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Keep cos/sin for the attention function when a runtime layer armed it and the one
    kernel takes these tensors (batch 1, cos/sin of [1, S, D]); False: rotate now."""
    if not _STATE.armed or _STATE.cos_sin is not None:
        return False
    if q.shape[0] != 1 or cos.shape[0] != 1 or not fe.triton_ok(q):
        return False
    _STATE.cos_sin = (cos, sin)
    return True


def take() -> tuple[torch.Tensor, torch.Tensor] | None:
    """The deferred cos/sin of this layer (once), or None when q and k came rotated."""
    got, _STATE.cos_sin = _STATE.cos_sin, None
    return got


def rotate(q: torch.Tensor, k: torch.Tensor, pending) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k rotated by the rope kernel alone (a piecewise step's cut)."""
    return (q, k) if pending is None else fe.apply_rope(q, k, *pending)


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
    fe.triton_kernels()._rope_kv_write_kernel[(s, nqb + -(-hkv // hb))](
        q, k, v, cos, sin, qo, ko, k_flat, v_flat, slots, s, hq, hkv,
        q.stride(1), q.stride(2), k.stride(1), k.stride(2), v.stride(1), v.stride(2),
        qo.stride(1), qo.stride(2), ko.stride(1), ko.stride(2), cos.stride(1), sin.stride(1),
        HALF=d // 2, HB=hb, NQB=nqb, num_warps=1, enable_fp_fusion=False,
    )  # fmt: skip
    return qo, ko


def rope_kv_ok(k: torch.Tensor, v: torch.Tensor, k_flat: torch.Tensor) -> bool:
    """Whether rope_kv_write takes these: contiguous head dims, a dense flat cache."""
    return (
        k.stride(-1) == 1
        and v.stride(-1) == 1
        and k_flat.is_contiguous()
        and k.dtype == v.dtype
        and v.shape == k.shape
    )
