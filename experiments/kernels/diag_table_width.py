"""Does a wide block table slow the decode kernel at short contexts? The Triton paged decode
kernel (the runtime's) for the 8B shape at 32 requests, each context timed with its own table
width (as the kernel tables were profiled) and with a table 8448 tokens wide (the seed workload's,
which the runtime keeps through the run). Per layer, inside a replayed graph, as profile_kernels
times it.

    python experiments/kernels/diag_table_width.py OUT.json      (on the GPU; repo root on sys.path)
"""

from __future__ import annotations

import json
import sys
import time

import torch

from cbsim.runtime.kernels.paged_attention import paged_decode_attention
from cbsim.runtime.profile_kernels import Timer, decode_calls

BATCH, HQ, HKV, D, BLOCK = 32, 32, 8, 128, 16
WIDE_TOKENS = 8448
CONTEXTS = (256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192)


def main(out: str) -> None:
    dev = torch.device("cuda")
    timer = Timer(dev, target_ms=3.0, deadline=time.monotonic() + 120)
    blocks = 8 * BATCH * WIDE_TOKENS // BLOCK + 1  # several copies of the widest tables
    kc = torch.randn(blocks, BLOCK, HKV, D, dtype=torch.bfloat16, device=dev)
    vc = torch.randn_like(kc)
    rows = []
    for ctx in CONTEXTS:
        own = timer(
            decode_calls(paged_decode_attention, kc, vc, HQ, BATCH, ctx, -(-ctx // BLOCK), D**-0.5)
        )
        wide = timer(
            decode_calls(
                paged_decode_attention, kc, vc, HQ, BATCH, ctx, WIDE_TOKENS // BLOCK, D**-0.5
            )
        )
        rows.append({"context": ctx, "own_width_us": own, "wide_us": wide, "ratio": wide / own})
        print(
            f"ctx {ctx:5d}: own width {own:7.1f} us, {WIDE_TOKENS}-token table {wide:7.1f} us, x{wide / own:.3f}",
            flush=True,
        )
    with open(out, "w") as f:
        json.dump(
            {"device": torch.cuda.get_device_name(), "batch": BATCH, "rows": rows}, f, indent=1
        )


if __name__ == "__main__":
    main(sys.argv[1])
