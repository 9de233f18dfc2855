"""Does the decode kernel run as the kernel tables timed it, under the runtime's block tables?

    python experiments/kernels/diag_table_width.py OUT.json      (on the GPU; repo root on sys.path)

The tables time the Triton paged decode kernel with a table as wide as each context and each
request's pages in one contiguous run. The runtime keeps one table width through a run (the
longest request's: 8448 tokens for the seed workload) and its allocator hands out pages as the
requests grow together, so one request's pages are strided by the batch. Per layer, inside a
replayed graph, as profile_kernels times it:

1. ``width``: the 8B shape at 32 requests, each context with its own width and with the 8448-token
   table, pages contiguous or interleaved; and, under the wide table, each explicit split-K
   partition and tile (what a graph captured for that context's width would run).
2. ``split``: few requests (1-16) at their own width: the auto partition against smaller ones
   (the auto rule never cuts partitions below 1024 tokens, so a batch of 4 runs 32 programs).
"""

from __future__ import annotations

import functools
import json
import sys
import time

import torch

from cbsim.runtime.kernels.paged_attention import paged_decode_attention
from cbsim.runtime.profile_kernels import Timer

BATCH, HQ, HKV, D, BLOCK = 32, 32, 8, 128, 16
WIDE_TOKENS = 8448
CONTEXTS = (256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
WIDE_CONFIGS = ((1024, 128), (1024, 64), (2048, 64), (4096, 64), (4096, 128))
SPLIT_BATCHES = (1, 4, 8, 16)
SPLIT_CONTEXTS = (256, 512, 1024, 2048, 4096)
SPLIT_PARTITIONS = (128, 256, 512, 1024)
COPIES = 8  # tables per point: 8 x 32 x 8448 tokens x 4 KiB rotate far past L2


def calls(kernel, kc, vc, b: int, ctx: int, width: int, interleaved: bool) -> list:
    """`COPIES` calls at `b` requests of context `ctx` with tables `width` blocks wide; pages
    of a request contiguous, or strided by the batch (page j of request r at j * b + r)."""
    q = torch.randn(b, HQ, D, dtype=kc.dtype, device=kc.device)
    lens = torch.full((b,), ctx, dtype=torch.int32, device=kc.device)
    out = []
    for c in range(COPIES):
        ids = torch.arange(b * width, dtype=torch.int32, device=kc.device) + c * b * width
        table = ids.view(width, b).t().contiguous() if interleaved else ids.view(b, width)
        out.append(functools.partial(kernel, q, kc, vc, table, lens, D**-0.5))
    return out


def width_section(timer: Timer, kc, vc) -> list[dict]:
    rows = []
    wide = WIDE_TOKENS // BLOCK
    for ctx in CONTEXTS:
        own = -(-ctx // BLOCK)
        row = {"context": ctx}
        for name, width, inter in (
            ("own", own, False),
            ("own_interleaved", own, True),
            ("wide", wide, False),
            ("wide_interleaved", wide, True),
        ):
            row[name] = timer(calls(paged_decode_attention, kc, vc, BATCH, ctx, width, inter))
        for part, tile in WIDE_CONFIGS:
            k = functools.partial(paged_decode_attention, partition_size=part, block_n=tile)
            row[f"wide_interleaved_p{part}_t{tile}"] = timer(
                calls(k, kc, vc, BATCH, ctx, wide, True)
            )
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def split_section(timer: Timer, kc, vc) -> list[dict]:
    rows = []
    for b in SPLIT_BATCHES:
        for ctx in SPLIT_CONTEXTS:
            width = -(-ctx // BLOCK)
            row = {"batch": b, "context": ctx}
            row["auto"] = timer(calls(paged_decode_attention, kc, vc, b, ctx, width, False))
            for part in SPLIT_PARTITIONS:
                for tile in (64, 128):
                    if tile > part:
                        continue
                    k = functools.partial(paged_decode_attention, partition_size=part, block_n=tile)
                    row[f"p{part}_t{tile}"] = timer(calls(k, kc, vc, b, ctx, width, False))
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main(out: str) -> None:
    dev = torch.device("cuda")
    timer = Timer(dev, target_ms=3.0, deadline=time.monotonic() + 240)
    blocks = COPIES * BATCH * WIDE_TOKENS // BLOCK + 1
    kc = torch.randn(blocks, BLOCK, HKV, D, dtype=torch.bfloat16, device=dev)
    vc = torch.randn_like(kc)
    result = {"device": torch.cuda.get_device_name(), "batch": BATCH, "wide_tokens": WIDE_TOKENS}
    result["width"] = width_section(timer, kc, vc)
    result["split"] = split_section(timer, kc, vc)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
