"""Paged attention plugged into transformers through its attention-function registry.

The model's layers stay transformers' own: `config._attn_implementation = "cbsim_paged"` makes every
LlamaAttention call `paged_attention_forward` with its rotated q/k/v, and the batch's metadata
arrives as the forward kwarg `cbsim_meta` (an AttnMeta). Each layer first writes the new K/V into the
paged cache, then attends over the cache:

- decode group (requests with one query token): a paged decode kernel when one is selected (the
  Triton kernel in runtime/kernels/), else the torch reference (gather the request's blocks, SDPA
  with a context-length mask);
- prompt chunks from position 0 ("pre" group): causal SDPA over the chunks' own keys (flash: no
  gather, no mask);
- chunks after a cached prefix ("ext" group): SDPA over the gathered blocks with a causal mask
  offset by the cached prefix. The two groups are padded to their own longest chunk, so a
  short continuation beside a long prompt never pays mask attention over the prompt's length
  (a diagnostic over the H200's recordings).

Everything here runs on device tensors only (no host syncs), so a decode-only forward can be
captured in a CUDA graph. A step with prompt tokens replayed from piecewise graphs
(runtime/piecewise.py) runs `attend` eagerly between its pieces, over the step's real groups;
one replayed from a full graph (runtime/full_graphs.py) attends inside it, every sequence in one
varlen kernel over fixed-capacity metadata.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from cbsim.costs.decode_kernel import LaunchRule

from .kernels import deferred_rope, rope_kv
from .kernels.paged_attention import paged_decode_attention_sdpa

ATTN_NAME = "cbsim_paged"
# The prefill chunks' SDPA backends: not cuDNN, which torch picks first on Hopper and which
# builds an execution plan per new shape (query rows x KV length): in continuous batching every
# mixed step has a new shape, and each plan build costs tens of milliseconds of host time
# (runtime/README.md). The memory-efficient kernel takes the causal-prefix mask
# without a per-shape plan; flash takes grouped-query K/V as they are (enable_gqa).
PREFILL_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]

# paged_decode_attention(q[B,Hq,D], k_cache, v_cache, block_tables[B,W] int32,
#                        context_lens[B] int32, scale) -> out[B,Hq,D]
DecodeKernel = Callable[..., torch.Tensor]


@dataclass
class AttnMeta:
    """One forward's attention metadata; tensors are views into the step's IO buffer."""

    cache: object  # PagedKVCache
    num_tokens: int
    slot_mapping: torch.Tensor  # [T] flat cache slot of each token's K/V
    # decode group: token index, block table row and context length per request
    dec_tok: torch.Tensor | None = None  # [Bd]
    dec_bt: torch.Tensor | None = None  # [Bd, W]
    dec_ctx: torch.Tensor | None = None  # [Bd]
    all_decode: bool = False  # every token is a decode token, in order: dec_tok == arange(T)
    # prompt chunks from position 0: first token index, query length
    pre_tok: torch.Tensor | None = None  # [Bp]
    pre_qlen: torch.Tensor | None = None  # [Bp]
    pre_qmax: int = 0  # longest chunk of the group (host int: shapes are static per step)
    # chunks after a cached prefix: first token index, query length, first position, block table
    ext_tok: torch.Tensor | None = None  # [Be]
    ext_qlen: torch.Tensor | None = None  # [Be]
    ext_start: torch.Tensor | None = None  # [Be]
    ext_bt: torch.Tensor | None = None  # [Be, We]
    ext_qmax: int = 0
    decode_kernel: DecodeKernel | None = None
    # a step replayed from piecewise graphs (runtime/piecewise.py): attention writes into ``out``
    # ([rows + 1, Hq, D], a buffer outside the graph pool that the next piece reads), and each
    # layer's call goes through ``split`` (where the piece being captured ends)
    out: torch.Tensor | None = None
    split: Callable[..., torch.Tensor] | None = None
    # a step replayed from one full graph (runtime/full_graphs.py): every sequence of the step
    # in one kernel over fixed-capacity metadata (runtime/kernels/varlen_attention.py), into
    # ``out``; the first token row, query and context length, block table of each sequence,
    # and the tile work list
    varlen: Callable[..., torch.Tensor] | None = None
    var_q0: torch.Tensor | None = None  # [S]
    var_qlen: torch.Tensor | None = None  # [S]
    var_ctx: torch.Tensor | None = None  # [S]
    var_bt: torch.Tensor | None = None  # [S, W]
    var_tile_seq: torch.Tensor | None = None  # [P]
    var_tile_q: torch.Tensor | None = None  # [P]
    _derived: dict = field(default_factory=dict)

    def derive(self) -> None:
        """Index tensors shared by all layers, computed once per forward (inside a graph too)."""
        d = self._derived
        if self.dec_tok is not None and self.decode_kernel is not None:
            d["dec_bt32"] = self.dec_bt.to(torch.int32)
            d["dec_ctx32"] = self.dec_ctx.to(torch.int32)
        for group in ("pre", "ext"):
            tok, qlen, qmax = (getattr(self, f"{group}_{k}") for k in ("tok", "qlen", "qmax"))
            if tok is None:
                continue
            ar = torch.arange(qmax, device=tok.device)
            valid = ar[None, :] < qlen[:, None]
            q_idx = tok[:, None] + ar[None, :]
            d[f"{group}_q_idx"] = torch.where(valid, q_idx, 0)
            # padded query rows scatter into a dummy row T of the output
            d[f"{group}_out_idx"] = torch.where(valid, q_idx, self.num_tokens).reshape(-1)
            if group == "ext":  # continuations: each query's position after its cached prefix
                d["ext_q_pos"] = torch.where(valid, self.ext_start[:, None] + ar[None, :], 0)


# the torch decode path: every page of the block table gathered, SDPA with a length mask
decode_torch = paged_decode_attention_sdpa


def prefill_torch(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttnMeta, scale: float
) -> torch.Tensor:
    """q [T, Hq, D] -> [Be, Qmax, Hq, D]: each chunk attends causally to its cached prefix and
    itself (the "ext" group: chunks after a cached prefix)."""
    d = meta._derived
    q_idx, q_pos = d["ext_q_idx"], d["ext_q_pos"]
    bp, qm = q_idx.shape
    hq, dim = q.shape[1:]
    k = k_cache[meta.ext_bt].flatten(1, 2)  # [Be, S, Hkv, D]
    v = v_cache[meta.ext_bt].flatten(1, 2)
    hkv, s, g = k.shape[2], k.shape[1], hq // k.shape[2]
    qg = q[q_idx].view(bp, qm, hkv, g, dim).permute(0, 2, 1, 3, 4).reshape(bp, hkv, qm * g, dim)
    mask = torch.arange(s, device=q.device)[None, None, :] <= q_pos[:, :, None]  # [Bp, Qm, S]
    # each query row repeated for its G heads (expand + reshape: no host sync, unlike
    # repeat_interleave, which may read the output size back from the device)
    mask = mask[:, :, None, :].expand(bp, qm, g, s).reshape(bp, qm * g, s)[:, None]
    with sdpa_kernel(PREFILL_BACKENDS):
        out = F.scaled_dot_product_attention(
            qg, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale
        )
    return out.view(bp, hkv, qm, g, dim).permute(0, 2, 1, 3, 4).reshape(bp, qm, hq, dim)


def prefill_fresh(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttnMeta, scale: float
) -> torch.Tensor:
    """Chunks with no cached prefix: q/k/v [T, H, D] -> [Bp, Qmax, Hq, D], causal attention over
    each chunk's own keys (flash; padded rows sit after the valid ones, so no mask is needed)."""
    q_idx = meta._derived["pre_q_idx"]
    bp, qm = q_idx.shape
    hq, dim = q.shape[1:]
    hkv = k.shape[1]
    qs = q[q_idx].transpose(1, 2)  # [Bp, Hq, Qm, D]
    ks, vs = (t[q_idx].transpose(1, 2) for t in (k, v))  # [Bp, Hkv, Qm, D]
    # grouped-query attention: each kv head serves hq // hkv query heads, read in place
    with sdpa_kernel(PREFILL_BACKENDS):
        out = F.scaled_dot_product_attention(
            qs, ks, vs, is_causal=True, scale=scale, enable_gqa=hkv != hq
        )
    return out.transpose(1, 2)


def _decode(q: torch.Tensor, layer: int, meta: AttnMeta, scale: float) -> torch.Tensor:
    cache = meta.cache
    kc, vc = cache.k[layer], cache.v[layer]
    if meta.decode_kernel is not None:
        d = meta._derived
        return meta.decode_kernel(q.contiguous(), kc, vc, d["dec_bt32"], d["dec_ctx32"], scale)
    return decode_torch(q, kc, vc, meta.dec_bt, meta.dec_ctx, scale)


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    cbsim_meta: AttnMeta | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: q/k/v [1, H, T, D] -> ([1, T, Hq, D], None)."""
    meta = cbsim_meta
    if meta is None:
        raise RuntimeError(f"attention {ATTN_NAME!r} needs the forward kwarg cbsim_meta (AttnMeta)")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    pending = deferred_rope.take()  # cos/sin when q and k come unrotated (mode.fuse_rope_kv)
    if meta.split is not None:  # a piecewise step: the piece being captured ends here
        query, key = rope_kv.rotate(query, key, pending)
        return meta.split(module.layer_idx, query, key, value, scale, meta), None
    return attend(module.layer_idx, query, key, value, scale, meta, pending), None


def attend(
    layer: int,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    meta: AttnMeta,
    rope: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """One layer's attention, q/k/v [1, H, T, D] -> [1, T, Hq, D]: the step's K/V into the
    paged cache, then each group (into ``meta.out`` when set: a piecewise replay calls this
    between two pieces, and the next piece reads that buffer). With ``rope`` (cos, sin) q and k
    come unrotated, and one kernel rotates them as it writes the cache."""
    if rope is None:
        meta.cache.write(layer, key[0].transpose(0, 1), value[0].transpose(0, 1), meta.slot_mapping)
    else:
        query, key = meta.cache.write_rotated(layer, query, key, value, rope, meta.slot_mapping)
    q = query[0].transpose(0, 1)  # [T, Hq, D]
    if meta.all_decode:
        return _decode(q, layer, meta, scale).unsqueeze(0)
    if meta.varlen is not None:
        kc, vc = meta.cache.k[layer], meta.cache.v[layer]
        meta.varlen(
            q, kc, vc, meta.out, meta.var_q0, meta.var_qlen, meta.var_ctx, meta.var_bt,
            meta.var_tile_seq, meta.var_tile_q, scale,
        )  # fmt: skip
        return meta.out[: q.shape[0]].unsqueeze(0)
    t, hq, dim = q.shape
    out = q.new_empty(t + 1, hq, dim) if meta.out is None else meta.out[: t + 1]
    if meta.dec_tok is not None:
        out.index_copy_(0, meta.dec_tok, _decode(q[meta.dec_tok], layer, meta, scale))
    if meta.pre_tok is not None:
        k, v = key[0].transpose(0, 1), value[0].transpose(0, 1)
        pre = prefill_fresh(q, k, v, meta, scale)
        out.index_copy_(0, meta._derived["pre_out_idx"], pre.reshape(-1, hq, dim))
    if meta.ext_tok is not None:
        ext = prefill_torch(q, meta.cache.k[layer], meta.cache.v[layer], meta, scale)
        out.index_copy_(0, meta._derived["ext_out_idx"], ext.reshape(-1, hq, dim))
    return out[:t].unsqueeze(0)


def register() -> None:
    """Make "cbsim_paged" a valid config._attn_implementation (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, paged_attention_forward)


def load_decode_kernel(
    choice: str, device: torch.device, rule: LaunchRule | None = None
) -> DecodeKernel | None:
    """The decode kernel for mode.attention: "torch" none, "triton" required, "auto" if it loads;
    launched by ``rule`` (engine.decode_launch; its default when None)."""
    if choice == "flex":
        raise ValueError(
            "mode.attention=flex is not implemented by the runtime; allowed: auto, torch, triton"
        )
    if choice == "torch" or (choice == "auto" and device.type != "cuda"):
        return None
    try:
        from .kernels.paged_attention import paged_decode_attention
    except ImportError as exc:
        if choice == "triton":
            raise ValueError(
                f"mode.attention=triton: the Triton kernel cannot load ({exc}); "
                "allowed here: mode.attention=torch or auto"
            ) from None
        return None
    if device.type != "cuda":
        raise ValueError("mode.attention=triton needs CUDA; allowed on a CPU: torch or auto")
    return paged_decode_attention if rule is None else partial(paged_decode_attention, rule=rule)
