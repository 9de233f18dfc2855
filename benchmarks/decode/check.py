"""Section check: the Triton paged decode kernel against the float32 torch reference on the GPU
(poisoned unused pages, padding rows, mixed lengths, several partitions), inside a CUDA graph too."""

from __future__ import annotations

import torch

from runtime.kernels.paged_attention import (
    paged_decode_attention,
    paged_decode_attention_reference,
    triton_available,
)


class CheckSection:
    """Section ``check`` (a ``Bench`` mixin)."""

    def check(self):
        """Triton kernel vs fp32 reference on the GPU, many shapes; results as relative errors."""
        if not (self.cuda and triton_available()):
            self.log("check: skipped (needs CUDA + triton)")
            return
        D, Hq, Hkv = 128, 32, 8
        torch.manual_seed(1)
        worst = 0.0
        cases = [  # (dtype, block size, partitions): one Triton compile per (dtype, bs, partition)
            (torch.bfloat16, 16, (None, 256, 512, 1024)),
            (torch.bfloat16, 64, (None, 512)),
            (torch.float16, 16, (512,)),
            (torch.float32, 16, (None, 512)),
        ]
        for dtype, block_size, partitions in cases:
            ctxs = [1, 15, 16, 17, 255, 1000, 2049, 0, 8192, 5000, 3, 777]
            B = len(ctxs)
            pages = [-(-c // block_size) for c in ctxs]
            num_blocks = sum(pages) + 8
            k = torch.randn(num_blocks, block_size, Hkv, D, device="cuda").to(dtype)
            v = torch.randn(num_blocks, block_size, Hkv, D, device="cuda").to(dtype)
            perm = torch.randperm(num_blocks, device="cuda")
            table = torch.full((B, max(pages) + 3), -1, dtype=torch.int32, device="cuda")
            used = torch.zeros(num_blocks, dtype=torch.bool, device="cuda")
            i = 0
            for b, n in enumerate(pages):
                table[b, :n] = perm[i : i + n].int()
                used[perm[i : i + n]] = True
                i += n
            k[~used] = float("nan")  # a kernel that reads a page it should not returns NaN
            v[~used] = float("nan")
            q = torch.randn(B, Hq, D, device="cuda").to(dtype)
            lens = torch.tensor(ctxs, dtype=torch.int32, device="cuda")
            ref = paged_decode_attention_reference(
                q.double(), k.double(), v.double(), table, lens, D**-0.5
            )
            for partition in partitions:
                out = torch.full_like(q, float("nan"))
                paged_decode_attention(
                    q, k, v, table, lens, D**-0.5, partition_size=partition, out=out
                )
                torch.cuda.synchronize()
                err = ((out.double() - ref).norm() / ref.norm()).item()
                max_abs = (out.double() - ref).abs().max().item()
                finite = bool(torch.isfinite(out).all())
                zero_rows = bool((out[lens == 0] == 0).all())
                worst = max(worst, err if dtype != torch.float32 else 0.0)
                self.record(
                    section="check",
                    dtype=str(dtype),
                    block_size=block_size,
                    partition=partition,
                    rel_err=err,
                    max_abs_err=max_abs,
                    finite=finite,
                    zero_rows=zero_rows,
                    ok=finite and zero_rows and err < (1e-5 if dtype == torch.float32 else 1e-2),
                )
            # inside a graph, with the lengths changed after capture
            out = torch.empty_like(q)
            graph = torch.cuda.CUDAGraph()
            paged_decode_attention(q, k, v, table, lens, D**-0.5, out=out)
            with torch.cuda.graph(graph):
                paged_decode_attention(q, k, v, table, lens, D**-0.5, out=out)
            lens2 = (lens // 2).to(torch.int32)
            lens.copy_(lens2)
            graph.replay()
            torch.cuda.synchronize()
            ref = paged_decode_attention_reference(
                q.double(), k.double(), v.double(), table, lens, D**-0.5
            )
            err = ((out.double() - ref).norm() / ref.norm()).item()
            self.record(
                section="check", dtype=str(dtype), block_size=block_size, partition="graph",
                rel_err=err, max_abs_err=(out.double() - ref).abs().max().item(),
                finite=bool(torch.isfinite(out).all()),
                ok=bool(torch.isfinite(out).all()) and err < (1e-5 if dtype == torch.float32 else 1e-2),
            )  # fmt: skip
        bad = [r for r in self.rows if r.get("section") == "check" and not r["ok"]]
        self.log(
            f"check: {'ALL OK' if not bad else f'{len(bad)} FAILED: {bad}'}; worst bf16/fp16 rel err {worst:.2e}"
        )
