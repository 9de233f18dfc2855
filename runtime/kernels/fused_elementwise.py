"""One kernel each for a transformers Llama model's RMSNorm and rotary embedding.

At batch 32 a decode step's elementwise work is tiny, but transformers' torch code launches it as
many small kernels: LlamaRMSNorm about 7 (cast, square, mean, add, rsqrt, multiply, cast, scale) and
apply_rotary_pos_emb about 10 (two multiplies, a negate, a concatenate and an add, for q and for k).
Over 32 layers that is some 900 launches per step, about 2 ms of a 7 ms step on the H200 even when
graph-replayed (the H200 benchmarks). `fuse_norm_and_rope(model)` replaces them with one Triton
kernel per RMSNorm and one per rotary application:

- every `*RMSNorm` module (with `weight` and `variance_epsilon`) gets an instance-level `forward`
  that calls the kernel (the module, its weight and the state dict are unchanged);
- the model's attention module namespace gets a wrapped `apply_rotary_pos_emb` (the function its
  forward calls by name), which runs the kernel for 4-D q/k with cos/sin of [B or 1, S, D].

Both round like the torch code (bf16 products and sums rounded where torch rounds them; compiled
with FP contraction off, since an FMA would round once where torch rounds twice), so outputs are
equal up to the fp32 summation order inside RMSNorm. On tensors the kernels cannot take (CPU, no
triton), both fall back to the original code. `unfuse_norm_and_rope(model)` undoes it.
"""

from __future__ import annotations

import functools
import os
import sys

import torch
from torch import nn

from . import deferred_rope
from .paged_attention import triton_next_pow2


@functools.cache
def triton_kernels():
    from . import _triton_elementwise

    return _triton_elementwise


def triton_ok(x: torch.Tensor) -> bool:
    if not (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        return False
    try:
        triton_kernels()
    except ImportError:
        return False
    return True


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * (x.float() * rsqrt(mean(x.float()^2, -1) + eps)).to(x.dtype), one kernel."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out_dtype = torch.promote_types(weight.dtype, x.dtype)
    out = torch.empty(x2.shape, dtype=out_dtype, device=x.device)
    block = triton_next_pow2(n)
    triton_kernels()._rmsnorm_kernel[(x2.shape[0],)](
        x2, weight, out, x2.stride(0), out.stride(0), eps, N=n, BLOCK=block,
        num_warps=max(1, min(16, block // 512)), enable_fp_fusion=False,
    )  # fmt: skip
    return out.view(*x.shape[:-1], n)


def apply_rope(q, k, cos, sin):
    """(q * cos + rotate_half(q) * sin, same for k) for q [B, Hq, S, D], k [B, Hkv, S, D],
    cos/sin [B or 1, S, D]; one kernel for both. Outputs keep q's and k's memory layout."""
    B, Hq, S, D = q.shape
    Hkv = k.shape[1]
    qo = torch.empty_like(q)
    ko = torch.empty_like(k)
    hb = 8
    nqb = -(-Hq // hb)
    grid = (B * S, nqb + -(-Hkv // hb))
    triton_kernels()._rope_kernel[grid](
        q, k, cos, sin, qo, ko, S, Hq, Hkv,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        qo.stride(0), qo.stride(1), qo.stride(2), ko.stride(0), ko.stride(1), ko.stride(2),
        cos.stride(0) if cos.shape[0] > 1 else 0, cos.stride(1),
        sin.stride(0) if sin.shape[0] > 1 else 0, sin.stride(1),
        HALF=D // 2, HB=hb, NQB=nqb, num_warps=1, enable_fp_fusion=False,
    )  # fmt: skip
    return qo, ko


def _rope_supported(q, k, cos, sin, unsqueeze_dim) -> bool:
    if (
        unsqueeze_dim != 1
        or q.dim() != 4
        or k.dim() != 4
        or cos.dim() != 3
        or sin.shape != cos.shape
    ):
        return False
    B, _, S, D = q.shape
    if k.shape[0] != B or k.shape[2:] != (S, D) or cos.shape not in ((B, S, D), (1, S, D)):
        return False
    if D % 2 or (D // 2) & (D // 2 - 1) or D < 4:
        return False
    if q.stride(-1) != 1 or k.stride(-1) != 1 or cos.stride(-1) != 1 or sin.stride(-1) != 1:
        return False
    return q.dtype == k.dtype == cos.dtype == sin.dtype and triton_ok(q)


def _rmsnorm_forward(module: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    if triton_ok(hidden_states) and hidden_states.shape[-1] == module.weight.shape[-1]:
        return rms_norm(hidden_states, module.weight, module.variance_epsilon)
    return type(module).forward(module, hidden_states)


_ORIGINAL_ROPE: dict[str, object] = {}


def _wrap_rope(original):
    @functools.wraps(original)
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1, *args, **kwargs):
        if not args and not kwargs and _rope_supported(q, k, cos, sin, unsqueeze_dim):
            if deferred_rope.defer(q, cos, sin):  # the attention rotates them as it writes K/V
                return q, k
            return apply_rope(q, k, cos, sin)
        return original(q, k, cos, sin, unsqueeze_dim, *args, **kwargs)

    apply_rotary_pos_emb.cbsim_fused = True
    return apply_rotary_pos_emb


def fuse_norm_and_rope(model: nn.Module, *, norm: bool = True, rope: bool = True) -> dict[str, int]:
    """Route the model's RMSNorms and rotary embeddings through one Triton kernel each (in place;
    idempotent). Returns how many norms and module namespaces were switched."""
    norms, namespaces = 0, set()
    for module in model.modules():
        name = type(module).__name__
        if norm and name.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            if "forward" not in module.__dict__:
                module.forward = functools.partial(_rmsnorm_forward, module)
                norms += 1
        if rope and name.endswith("Attention"):
            ns = sys.modules.get(type(module).__module__)
            fn = getattr(ns, "apply_rotary_pos_emb", None)
            if fn is not None and not getattr(fn, "cbsim_fused", False):
                _ORIGINAL_ROPE[ns.__name__] = fn
                ns.apply_rotary_pos_emb = _wrap_rope(fn)
                namespaces.add(ns.__name__)
    return {"rms_norms": norms, "rope_namespaces": len(namespaces)}


def unfuse_norm_and_rope(model: nn.Module) -> None:
    """Undo fuse_norm_and_rope (the RoPE wrapper is per module namespace: it is undone for every
    model of that architecture in the process)."""
    for module in model.modules():
        if "forward" in module.__dict__ and isinstance(module.forward, functools.partial):
            if module.forward.func is _rmsnorm_forward:
                del module.forward
        ns = sys.modules.get(type(module).__module__)
        if ns is not None and ns.__name__ in _ORIGINAL_ROPE:
            ns.apply_rotary_pos_emb = _ORIGINAL_ROPE.pop(ns.__name__)
