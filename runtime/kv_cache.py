"""The paged KV cache's device memory: per layer one K and one V tensor of
[num_blocks + 1, block_size, num_kv_heads, head_dim].

Block ids 0..num_blocks-1 are the ones cbsim.kv_blocks hands out; the extra last block is scratch:
padded rows of a graph-replayed batch write their K/V there and read it back, so padding never
touches a live request's cache.
"""

from __future__ import annotations

import torch

from .kernels.fused_epilogues import kv_write, kv_write_ok
from .kernels.rope_kv import rope_kv_ok, rope_kv_write, rotate


class PagedKVCache:
    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.scratch_block = num_blocks
        # mode.fuse_epilogues: one Triton kernel writes a step's K and V (kernels/fused_epilogues)
        self.fused = False
        shape = (num_blocks + 1, block_size, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @property
    def scratch_slot(self) -> int:
        return self.scratch_block * self.block_size

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def write(
        self, layer: int, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        """Store key/value [T, Hkv, D] at flat slots (block * block_size + offset)."""
        k = self.k[layer].view(-1, *self.k[layer].shape[2:])
        v = self.v[layer].view(-1, *self.v[layer].shape[2:])
        if self.fused and kv_write_ok(key, value):
            kv_write(key, value, k, v, slot_mapping)
            return
        k.index_copy_(0, slot_mapping, key)
        v.index_copy_(0, slot_mapping, value)

    def write_rotated(
        self,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        slot_mapping: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k [1, H, T, D] rotated, the rotated K and V stored at flat slots: one kernel
        (mode.fuse_rope_kv) where it takes the tensors, else the rope kernel and ``write``."""
        k = self.k[layer].view(-1, *self.k[layer].shape[2:])
        v = self.v[layer].view(-1, *self.v[layer].shape[2:])
        if self.fused and rope_kv_ok(key, value, k, v):
            return rope_kv_write(query, key, value, cos_sin, k, v, slot_mapping)
        query, key = rotate(query, key, cos_sin)
        self.write(layer, key[0].transpose(0, 1), value[0].transpose(0, 1), slot_mapping)
        return query, key
