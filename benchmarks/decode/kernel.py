"""Section kernel: 32 layers of decode attention per context, Triton variants vs gathered SDPA vs
the fp32 reference; picks the Triton config the model section uses."""

from __future__ import annotations

import gc
import math

import torch

from runtime.kernels.paged_attention import (
    paged_decode_attention,
    paged_decode_attention_reference,
    paged_decode_attention_sdpa,
    triton_available,
)


class KernelSection:
    """Section ``kernel`` (a ``Bench`` mixin)."""

    def kernel(self):
        """32 layers of attention per context; picks the fastest Triton config for the model section."""
        a = self.args
        B, Hq, Hkv, D, L = a.batch, 32, 8, 128, 32
        if not self.cuda:
            B, Hq, Hkv, D, L = 4, 8, 2, 16, 2
        dtype = torch.bfloat16 if self.cuda else torch.float32
        contexts = self.contexts
        max_ctx = max(contexts)
        caches, table_full = self.make_cache(B, max_ctx, L, a.block_size, Hkv, D, dtype)
        q = torch.randn(B, Hq, D, device=self.device, dtype=dtype)
        scale = D**-0.5
        variants = {}
        if self.cuda and triton_available():
            # run 1 swept block_n, warps, stages and partitions 128..2048 at p512 (perf-notes.md);
            # run 2 checks the "auto" partition against its neighbours and the two runner-up tiles
            for p, bn, nw, ns in (
                ("auto", 64, 4, 2),
                ("auto", 64, 4, 3),
                ("auto", 128, 4, 2),
                (1024, 64, 4, 2),
                (2048, 64, 4, 2),
                (4096, 64, 4, 2),
            ):
                variants[f"triton p{p} n{bn} w{nw} s{ns}"] = dict(
                    fn=paged_decode_attention,
                    kw=dict(partition_size=p, block_n=bn, num_warps=nw, num_stages=ns),
                )
        variants["torch sdpa-gather"] = dict(fn=paged_decode_attention_sdpa, kw={})
        variants["torch fp32 reference"] = dict(fn=paged_decode_attention_reference, kw={})
        sweep_only = {
            k for k in variants if k.startswith("triton") and k != "triton pauto n64 w4 s2"
        }
        results = {}
        for ctx in contexts:
            pages = -(-ctx // a.block_size)
            table = table_full[:, :pages].contiguous()
            lens = torch.full((B,), ctx, dtype=torch.int32, device=self.device)
            kv_bytes = L * B * ctx * Hkv * D * 2 * torch.finfo(dtype).bits // 8
            for name, var in variants.items():
                if self.left() < a.reserve_s:
                    self.log("kernel: out of time")
                    return
                if name in sweep_only and ctx not in contexts:
                    continue
                if name == "torch fp32 reference" and ctx > 1024:
                    continue
                fn, kw = var["fn"], var["kw"]

                def step(fn=fn, kw=kw, table=table, lens=lens):
                    for k, v in caches:
                        fn(q, k, v, table, lens, scale, **kw)

                try:
                    t = self.time_fn(step)
                except Exception as e:  # a variant that fails to compile or capture is reported
                    self.record(section="kernel", variant=name, ctx=ctx, error=repr(e)[:300])
                    self.log(f"kernel {name} ctx {ctx}: FAILED {e!r:.200}")
                    continue
                gbs = kv_bytes / (t["ms"] * 1e-3) / 1e9
                results[(name, ctx)] = t["ms"]
                self.record(section="kernel", variant=name, ctx=ctx, layers=L, batch=B, kv_bytes=kv_bytes,
                            gbps=gbs, pct_copy=100 * gbs / (self.copy_tbps * 1e3), **t)  # fmt: skip
                self.log(
                    f"kernel {name:28s} ctx {ctx:5d}: {t['ms']:8.3f} ms/32 layers  {gbs:7.0f} GB/s"
                )
            # the same kernel with a table sized for the longest context: reads only live KV
            if self.cuda and triton_available() and ctx < max_ctx:
                name = "triton pauto n64 w4 s2 (full-width table)"

                def step_full(lens=lens):
                    for k, v in caches:
                        paged_decode_attention(q, k, v, table_full, lens, scale)

                t = self.time_fn(step_full)
                gbs = kv_bytes / (t["ms"] * 1e-3) / 1e9
                self.record(section="kernel", variant=name, ctx=ctx, layers=L, batch=B, kv_bytes=kv_bytes,
                            gbps=gbs, pct_copy=100 * gbs / (self.copy_tbps * 1e3), **t)  # fmt: skip
                self.log(
                    f"kernel {name:28s} ctx {ctx:5d}: {t['ms']:8.3f} ms/32 layers  {gbs:7.0f} GB/s"
                )
        # the best Triton config over the contexts where all were timed
        swept = list(contexts)
        best, best_total = None, math.inf
        for name in variants:
            if not name.startswith("triton"):
                continue
            ts = [results.get((name, c)) for c in swept]
            if None not in ts and sum(ts) < best_total:
                best, best_total = name, sum(ts)
        if best:
            self.triton_kw = variants[best]["kw"]
            self.record(section="kernel", best=best, best_kw=self.triton_kw)
            self.log(f"kernel: best Triton config {best} {self.triton_kw}")
        caches = None  # noqa: F841 (frees the 32 layers' KV before the next section)
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()
