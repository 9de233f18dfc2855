"""Section launches: the paged decode-attention kernel's launch parameters (tile, warps, stages,
partition) swept at the decode graphs' own shapes, where the step is furthest from the copy rate:
the 8B at 16 and 32 requests over short contexts, the 1B at 128. Each point is a graph of
``LAYERS`` layers' calls, every layer its own KV cache (none served from L2), timed against the
live KV bytes at the copy rate the env section measured; the rule the runtime uses ("auto") is
timed beside it."""

from __future__ import annotations

import gc
import itertools

import torch

from runtime.kernels.paged_attention import paged_decode_attention, triton_available

LAYERS = 8
# (label, requests, query heads, kv heads, head dim, contexts): the bench_decode cases' shapes
SHAPES = (
    ("8b", 16, 32, 8, 128, (256, 512, 768)),
    ("8b", 32, 32, 8, 128, (512, 768)),
    ("1b", 128, 32, 8, 64, (256, 512, 768)),
)
TILES, WARPS, STAGES = (32, 64, 128), (4, 8), (2, 3, 4)
PARTITIONS = (None, 128, 256)  # None: one partition over the table, no reduce kernel


class LaunchSection:
    """Section ``launches`` (a ``Bench`` mixin)."""

    def launches(self):
        """Every (tile, warps, stages, partition) at each shape and context, with "auto" first."""
        if not (self.cuda and triton_available()):
            self.log("launches: needs CUDA and triton")
            return
        dtype, bs = torch.bfloat16, self.args.block_size
        for label, B, Hq, Hkv, D, contexts in SHAPES:
            caches, table_full = self.make_cache(B, max(contexts), LAYERS, bs, Hkv, D, dtype)
            q = torch.randn(B, Hq, D, device=self.device, dtype=dtype)
            for ctx in contexts:
                table = table_full[:, : -(-ctx // bs)].contiguous()
                lens = torch.full((B,), ctx, dtype=torch.int32, device=self.device)
                kv_bytes = LAYERS * B * ctx * Hkv * D * 2 * 2
                variants = [("auto", {})] + [
                    (
                        f"t{t} w{w} s{s} p{p or 'all'}",
                        dict(block_n=t, num_warps=w, num_stages=s, partition_size=p),
                    )  # fmt: skip
                    for t, w, s, p in itertools.product(TILES, WARPS, STAGES, PARTITIONS)
                    if p is None or p >= t
                ]
                for name, kw in variants:
                    if self.left() < self.args.reserve_s:
                        self.log("launches: out of time")
                        return
                    self._time_launch(label, B, ctx, name, kw, q, caches, table, lens, kv_bytes)
            del caches
            gc.collect()
            torch.cuda.empty_cache()

    def _time_launch(self, label, B, ctx, name, kw, q, caches, table, lens, kv_bytes):
        scale = q.shape[-1] ** -0.5

        def step():
            for k, v in caches:
                paged_decode_attention(q, k, v, table, lens, scale, **kw)

        try:
            t = self.time_fn(step)
        except Exception as e:  # a launch that fails to compile or capture is reported
            self.record(section="launches", model=label, batch=B, ctx=ctx, variant=name,
                        error=repr(e)[:300])  # fmt: skip
            return
        us = 1e3 * t["ms"] / LAYERS
        tbps = getattr(self, "measured_tbps", None) or self.copy_tbps  # env's copy, when it ran
        pct = 100 * kv_bytes / (t["ms"] * 1e-3) / (tbps * 1e12)
        self.record(section="launches", model=label, batch=B, ctx=ctx, variant=name,
                    us_per_layer=us, pct_copy=pct, **t)  # fmt: skip
        self.log(
            f"launches {label} B={B:3d} ctx {ctx:4d} {name:22s} {us:7.2f} us/layer {pct:5.1f}%"
        )
