"""Decode kernels and the bare model step of the 8B shape at batch 32 against the H200 memory-bandwidth floor
(the end-to-end table of the runtime is benchmarks/bench_decode.py).

One run does, in order (each section guarded by a time budget, results appended as JSON lines):

  env      device, versions, the measured copy bandwidth (the floor's denominator)
  check    the Triton paged decode kernel against the float32 torch reference on the GPU (poisoned
           unused pages, padding rows, mixed lengths, several partitions), inside a CUDA graph too
  kernel   32 layers of decode attention (one graph, one KV cache per layer, B=32, Hq=32, Hkv=8,
           D=128) per context: Triton variants vs gathered SDPA vs the fp32 reference
  launches the decode-attention kernel's tile, warps, stages and partition swept at the 8B's 16
           and 32 requests and the 1B's 128 over short contexts (benchmarks/decode/launches.py);
           not in the default sections
  gemm     the M=32 bf16 projections of one layer, unfused (q, k, v, gate, up) vs fused (qkv,
           gate_up), each over 32 weight copies (as 32 layers would be; none fits in L2)
  skinny   a Triton GEMM for few rows against cuBLAS on the 8B, 1B and 3B projections at the
           decode graphs' rows (a candidate: the runtime calls cuBLAS, which it matches within 5%
           on the H100, experiments/benchmarks/h100/skinny_gemm.txt); not in the default sections
  model    the 8B Llama (random bf16 weights, transformers' own layers) decode step, CUDA-graph
           replayed: paged KV + Triton kernel vs gathered SDPA, unfused vs fused projections,
           transformers' own `sdpa` over a StaticCache, and a no-attention step (weights only)

Run on the GPU machine (no cbsim imports, so no hydra/omegaconf needed there):
    PYTHONUNBUFFERED=1 python3 benchmarks/bench_kernels.py --out $OUT
and on a CPU for a smoke test of the plumbing:
    python benchmarks/bench_kernels.py --small
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks, runtime
from benchmarks.decode.bench import Bench  # noqa: E402
from benchmarks.decode.common import COPY_TBPS_BRIEF, SHAPE_8B, SHAPE_SMALL  # noqa: E402

__all__ = ["COPY_TBPS_BRIEF", "SHAPE_8B", "SHAPE_SMALL", "Bench", "main"]


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default=os.environ.get("OUT", "bench_kernels_out"))
    p.add_argument("--contexts", default="256,1024,4096,8192")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--sections", default="env,check,kernel,gemm,model")
    p.add_argument(
        "--deadline", type=float, default=270.0, help="seconds; sections stop starting work after"
    )
    p.add_argument(
        "--reserve-s", type=float, default=10.0, help="stop a section when less than this is left"
    )
    p.add_argument("--skip-hf", action="store_true", help="skip transformers' sdpa + StaticCache")
    p.add_argument(
        "--small", action="store_true", help="tiny model on the CPU: a smoke test of the plumbing"
    )
    args = p.parse_args(argv)
    bench = Bench(args)
    if args.small:
        bench.contexts = [8, 40]
        args.batch = 4
    else:
        bench.contexts = [int(c) for c in args.contexts.split(",")]
    budgets = dict(
        check=30.0, kernel=60.0, launches=240.0, gemm=20.0, skinny=150.0
    )  # seconds; the model section gets the rest
    for name in args.sections.split(","):
        bench.section_end = bench.elapsed() + budgets.get(name, math.inf)
        try:
            getattr(bench, name)()
        except Exception as e:
            bench.record(section=name, error=repr(e)[:500])
            bench.log(f"{name}: FAILED {e!r:.500}")
            traceback.print_exc()
    bench.table()
    bench.log("done")


if __name__ == "__main__":
    main()
