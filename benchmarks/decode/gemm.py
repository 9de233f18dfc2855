"""Section gemm: the M=32 bf16 projections of one layer, unfused vs fused, over 32 weight copies."""

from __future__ import annotations

import torch


class GemmSection:
    """Section ``gemm`` (a ``Bench`` mixin)."""

    def gemm(self):
        """M=32 bf16 GEMMs of one 8B layer: unfused vs fused, over 32 weight copies each."""
        if not self.cuda:
            self.log("gemm: skipped (CPU)")
            return
        H, inter, M, copies = 4096, 14336, self.args.batch, 32
        shapes = {
            "q": (4096, H), "k": (1024, H), "v": (1024, H), "qkv": (6144, H), "o": (H, 4096),
            "gate": (inter, H), "up": (inter, H), "gate_up": (2 * inter, H), "down": (H, inter), "lm_head": (128256, H),
        }  # fmt: skip
        x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
        xd = torch.randn(M, inter, device="cuda", dtype=torch.bfloat16)
        per = {}
        for name, (n, k) in shapes.items():
            if self.left() < self.args.reserve_s:
                return
            c = 2 if name == "lm_head" else copies
            ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(c)]
            inp = xd if k == inter else x

            def step(ws=ws, inp=inp):
                for w in ws:
                    torch.nn.functional.linear(inp, w)

            t = self.time_fn(step)
            us = t["ms"] * 1e3 / c
            gbs = n * k * 2 / (us * 1e-6) / 1e9
            per[name] = us
            self.record(section="gemm", name=name, n=n, k=k, m=M, us_per_gemm=us, gbps=gbs,
                        pct_copy=100 * gbs / (self.copy_tbps * 1e3))  # fmt: skip
            self.log(f"gemm {name:8s} [{M}x{k}]x[{k}x{n}]: {us:8.1f} us  {gbs:7.0f} GB/s")
            del ws
        if {"q", "k", "v", "qkv", "gate", "up", "gate_up"} <= per.keys():
            unf = per["q"] + per["k"] + per["v"] + per["gate"] + per["up"]
            fus = per["qkv"] + per["gate_up"]
            self.record(section="gemm", summary="per layer", unfused_us=unf, fused_us=fus,
                        saved_ms_per_step=(unf - fus) * 32 / 1e3)  # fmt: skip
            self.log(f"gemm: q+k+v+gate+up {unf:.1f} us vs qkv+gate_up {fus:.1f} us per layer: "
                     f"{(unf - fus) * 32 / 1e3:.3f} ms/step saved over 32 layers")  # fmt: skip
        torch.cuda.empty_cache()
