"""Why the simulator is long on the 1B shape at 96 requests past 2048 tokens of context
(h200_run15/classes/1b_96x256+3072: simulated forwards 10-16% over the recorded ones there).
The 1B's decode kernel (32 query heads, 8 kv heads, head_dim 64) at the kernel table's grid
points around it, each at its own width, and at the runtime's own points (96 requests, the
3328-token table of that run's last launch class).

    python experiments/kernels/diag_1b_decode.py OUT.json      (on the GPU; repo root on sys.path)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import diag_table_width as dtw  # noqa: E402
from diag_table_width import calls  # noqa: E402

from cbsim.runtime.kernels.paged_attention import paged_decode_attention  # noqa: E402
from cbsim.runtime.profile_kernels import Timer  # noqa: E402

# (requests, context, table width in tokens)
POINTS = (
    (64, 2048, 2048),
    (64, 4096, 4096),
    (128, 2048, 2048),
    (128, 4096, 4096),
    (96, 2048, 2048),
    (96, 3072, 3072),
    (96, 4096, 4096),
    (96, 2560, 3328),
    (96, 3072, 3328),
    (96, 3328, 3328),
)


def main(out: str) -> None:
    dtw.HQ, dtw.HKV, dtw.D = 32, 8, 64
    dev = torch.device("cuda")
    timer = Timer(dev, target_ms=3.0, deadline=time.monotonic() + 100)
    blocks = dtw.COPIES * 128 * 4096 // 16 + 1
    kc = torch.randn(blocks, 16, 8, 64, dtype=torch.bfloat16, device=dev)
    vc = torch.randn_like(kc)
    rows = []
    for b, ctx, width in POINTS:
        us = timer(calls(paged_decode_attention, kc, vc, b, ctx, width // 16, True))
        tbps = b * ctx * 8 * 64 * 2 * 2 / us * 1e-6
        rows.append({"batch": b, "context": ctx, "width": width, "us": us, "tb_per_s": tbps})
        print(json.dumps(rows[-1]), flush=True)
    Path(out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}))


if __name__ == "__main__":
    main(sys.argv[1])
