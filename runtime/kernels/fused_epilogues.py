"""Fold a transformers Llama layer's small kernels into their neighbours (``mode.fuse_epilogues``).

After the projections are fused and RMSNorm and RoPE are one kernel each, a decode layer of the
8B shape at batch 32 still launches four kernels that move almost nothing: the two residual adds,
one of SiLU and the multiply after gate/up, one of the K and V cache writes. Each costs 1.5-3 us
inside a replayed graph and 30-60 us of host time when launched eagerly
(the H200 benchmarks). Here:

- ``o_proj`` and ``down_proj`` add their GEMM into the residual (``addmm_``: cuBLAS with beta = 1
  reads and writes the residual as C; inference only, with autograd on they add after): the
  decoder layer gets an instance ``forward`` that hands each its residual;
- the MLP (with a fused ``gate_up_proj`` and SiLU) gets an instance ``forward`` that runs SiLU x up
  as one Triton kernel;
- ``kv_write`` stores a step's K and V into the paged cache with one Triton kernel
  (runtime/kv_cache.py calls it when the cache is marked ``fused``); with ``mode.fuse_rope_kv``
  the rotation of q and k joins that kernel (runtime/kernels/rope_kv.py, deferred_rope.py).

The residual is added before the GEMM's output is rounded, so a bf16 layer's output differs from
transformers' by one rounding of the sum; compare engines on the same (fused) model. On tensors the
Triton kernels cannot take (CPU, no triton) the MLP and the cache write fall back to torch; the
residual GEMM runs anywhere. ``unfuse_epilogues(model)`` undoes it.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from . import deferred_rope
from .fused_elementwise import triton_kernels, triton_ok
from .paged_attention import triton_next_pow2

SILU_BLOCK = 1024  # elements of one row per program


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of a [..., 2 * I] tensor whose halves are gate and up, one kernel."""
    n2 = gate_up.shape[-1]
    n = n2 // 2
    x = gate_up.reshape(-1, n2)
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    if x.shape[0]:
        grid = (x.shape[0], -(-n // SILU_BLOCK))
        triton_kernels()._silu_mul_kernel[grid](
            x, out, x.stride(0), out.stride(0), n, BLOCK=SILU_BLOCK, num_warps=4,
            enable_fp_fusion=False,
        )  # fmt: skip
    return out.view(*gate_up.shape[:-1], n)


def kv_write_ok(key: torch.Tensor, value: torch.Tensor) -> bool:
    d = key.shape[-1]
    return (
        triton_ok(key)
        and d >= 16
        and d & (d - 1) == 0
        and key.stride(-1) == 1
        and value.stride(-1) == 1
    )


def kv_write(
    key: torch.Tensor, value: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, slots
) -> None:
    """Store key/value [T, H, D] at ``slots`` of the contiguous caches [slots, H, D], one kernel."""
    t, h, d = key.shape
    if t == 0:
        return
    triton_kernels()._kv_write_kernel[(t,)](
        key, value, k_flat, v_flat, slots, key.stride(0), key.stride(1), value.stride(0),
        value.stride(1), h, HB=triton_next_pow2(h), D=d, num_warps=4,
    )  # fmt: skip


def _residual_linear_forward(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    residual = linear.__dict__.pop("cbsim_residual", None)
    if residual is None:
        return F.linear(x, linear.weight, linear.bias)
    if torch.is_grad_enabled() or not residual.is_contiguous():
        return residual + F.linear(x, linear.weight, linear.bias)
    # into the residual itself: an out-of-place addmm first copies C into its output, which is
    # the kernel this saves; the layer's input is read by its norm before (stream order) and by
    # nothing after, so the residual stream stays in one buffer through the layers
    n = linear.weight.shape[0]
    r = residual.view(-1, n)
    if linear.bias is not None:
        r.add_(linear.bias)
    r.addmm_(x.reshape(-1, x.shape[-1]), linear.weight.t())
    return r.view(*x.shape[:-1], n)


def _layer_forward(layer: nn.Module, hidden_states: torch.Tensor, *args, **kwargs):
    if args:  # transformers calls its layers with keywords; anything else runs the original
        return type(layer).forward(layer, hidden_states, *args, **kwargs)
    layer.self_attn.o_proj.cbsim_residual = hidden_states
    h = layer.input_layernorm(hidden_states)
    # RoPE waits for the K/V write in the runtime's own attention (its batch metadata is here)
    deferred_rope.arm(
        layer.__dict__.get("cbsim_rope_kv", False) and kwargs.get("cbsim_meta") is not None
    )
    try:
        h, _ = layer.self_attn(hidden_states=h, **kwargs)  # residual + attention, from o_proj
    finally:
        deferred_rope.arm(False)
    layer.mlp.down_proj.cbsim_residual = h
    return layer.mlp(layer.post_attention_layernorm(h))  # h + MLP, from down_proj


def _mlp_forward(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    fused = mlp.gate_up_proj
    if not triton_ok(x):
        return type(mlp).forward(mlp, x)
    return mlp.down_proj(silu_mul(F.linear(x, fused.weight, fused.bias)))


def _is_silu(act: nn.Module) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"


def _fusable_layer(layer: nn.Module) -> bool:
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    return (
        isinstance(getattr(attn, "o_proj", None), nn.Linear)
        and isinstance(getattr(mlp, "down_proj", None), nn.Linear)
        and all(hasattr(layer, n) for n in ("input_layernorm", "post_attention_layernorm"))
    )


def fuse_epilogues(model: nn.Module, *, rope_kv_write: bool = False) -> dict[str, int]:
    """Residual adds into the o_proj and down GEMMs, SiLU x up into one kernel (where gate/up
    are fused), in place and idempotent; with ``rope_kv_write`` RoPE joins the K/V write
    (runtime/kernels/rope_kv.py, deferred_rope.py). Returns how many layers and MLPs were switched."""
    layers = mlps = 0
    for module in model.modules():
        if type(module).__name__.endswith("DecoderLayer") and _fusable_layer(module):
            module.cbsim_rope_kv = rope_kv_write
            if "forward" not in module.__dict__:
                module.forward = functools.partial(_layer_forward, module)
                for linear in (module.self_attn.o_proj, module.mlp.down_proj):
                    linear.forward = functools.partial(_residual_linear_forward, linear)
                layers += 1
            mlp = module.mlp
            fused_gate_up = getattr(mlp, "gate_up_proj", None) is not None
            if fused_gate_up and _is_silu(mlp.act_fn) and "forward" not in mlp.__dict__:
                mlp.forward = functools.partial(_mlp_forward, mlp)
                mlps += 1
    return {"layers": layers, "mlps": mlps}


def unfuse_epilogues(model: nn.Module) -> None:
    """Undo fuse_epilogues."""
    owned = (_layer_forward, _mlp_forward, _residual_linear_forward)
    for module in model.modules():
        fwd = module.__dict__.get("forward")
        if isinstance(fwd, functools.partial) and fwd.func in owned:
            del module.forward
        module.__dict__.pop("cbsim_residual", None)
        module.__dict__.pop("cbsim_rope_kv", None)
