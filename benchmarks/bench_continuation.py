"""A continuation chunk's attention, one layer, through the runtime's two paths, on the GPU:

  masked  the chunk's queries against the gathered table, causal mask offset by the prefix
          (runtime/attention.py prefill_torch: the "ext" group)
  rows    the chunk's tokens as decode rows over the request's one table, each up to its own
          position (the paged Triton decode kernel; engine.continuation_decode_max)
  priced  what the cost model charges for the rows (a kernel table's decode rows, whose tables
          are distinct: the rows here share one, which L2 may serve)

Each timing rotates over table copies past L2 (as a forward's layers do) and is the median of
CUDA-event timed repeats; `diff` is the largest difference between the two routes' outputs. The
table says where rows pay (engine.continuation_decode_max).

    python benchmarks/bench_continuation.py [--model llama3_8b] [--out FILE.json]   (the GPU)
    python benchmarks/bench_continuation.py --small   (a CPU smoke test of the plumbing: the tiny
                                                       model, the torch decode path, wall time)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

from cbsim.api import compose
from cbsim.costs import CostModel

QUERIES = (4, 16, 64, 128, 256, 512, 1024)
CONTEXTS = (1024, 4096, 8192)
COPIES = 6  # table copies rotated per timing: 6 x 33 MB at 8K tokens of the 8B, past the L2


def timed(calls, torch, reps: int = 5) -> float:
    """Median us of one call, over ``reps`` rounds of the rotated calls (CUDA events; on a CPU
    the wall clock)."""
    for c in calls:
        c()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        if not cuda:
            t0 = time.perf_counter()
            for c in calls:
                c()
            out.append((time.perf_counter() - t0) * 1e6 / len(calls))
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for c in calls:
            c()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / len(calls))
    return statistics.median(out)


def measure(model: str, queries, contexts, copies: int = COPIES) -> list[dict]:
    import torch

    from cbsim.runtime.kv_cache import PagedKVCache

    cfg = compose(f"model={model}")
    m, bs = cfg.model, cfg.workload.kv_block_size
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    width = -(-max(contexts) // bs)
    cache = PagedKVCache(1, copies * width, bs, m.num_kv_heads, m.head_dim, dt, dev)
    cache.k[0].normal_()
    cache.v[0].normal_()
    tables = torch.arange(copies * width, device=dev).view(copies, width)
    rows = []
    for ctx in contexts:
        w = -(-ctx // bs)
        for q in (n for n in queries if n < ctx):
            x = torch.randn(q, m.num_heads, m.head_dim, dtype=dt, device=dev)
            masked = _masked_calls(cache, tables[:, :w], x, ctx - q, m.head_dim**-0.5)
            dec = _row_calls(cache, tables[:, :w], x, ctx - q, m.head_dim**-0.5)
            diff = (masked[0]()[0].float() - dec[0]().float()).abs().max().item()
            rows.append(
                {
                    "q": q,
                    "ctx": ctx,
                    "masked_us": timed(masked, torch),
                    "rows_us": timed(dec, torch),
                    "diff": diff,
                }
            )
    return rows


def _masked_calls(cache, tables, x, start: int, scale: float) -> list:
    """The "ext" path over each table copy, as runtime/attention.py runs a continuation."""
    import torch

    from cbsim.runtime.attention import AttnMeta, prefill_torch

    q, dev = x.shape[0], x.device
    calls = []
    for t in tables:
        meta = AttnMeta(
            cache=cache, num_tokens=q, slot_mapping=torch.zeros(q, dtype=torch.long, device=dev)
        )
        meta.ext_tok = torch.zeros(1, dtype=torch.long, device=dev)
        meta.ext_qlen = torch.tensor([q], device=dev)
        meta.ext_start = torch.tensor([start], device=dev)
        meta.ext_bt, meta.ext_qmax = t[None], q
        meta.derive()
        calls.append(partial(prefill_torch, x, cache.k[0], cache.v[0], meta, scale))
    return calls


def _row_calls(cache, tables, x, start: int, scale: float) -> list:
    """The chunk's tokens as decode rows over one table copy each call (attention_groups)."""
    import torch

    from cbsim.runtime.kernels.paged_attention import get_decode_attention

    kernel = get_decode_attention("auto", x.device)  # the Triton kernel on CUDA, else torch
    q, w = x.shape[0], tables.shape[1]
    lens = torch.arange(start + 1, start + q + 1, dtype=torch.int32, device=x.device)
    return [
        partial(
            kernel,
            x,
            cache.k[0],
            cache.v[0],
            t.to(torch.int32)[None].expand(q, w).contiguous(),
            lens,
            scale,
        )
        for t in tables
    ]


def priced(model: str, rows: list[dict]) -> None:
    """The cost model's price of each row set, per layer: the attention CostModel.forward charges
    an eager step of those decode rows (the default profile)."""
    import numpy as np

    from cbsim.calibration.steps import StepShape

    cm = CostModel(compose(f"model={model}"))
    for r in rows:
        q, ctx = r["q"], np.arange(r["ctx"] - r["q"] + 1, r["ctx"] + 1)
        shape = StepShape(q, q, int(ctx.sum()), q, "decode", (np.ones(q, np.int64), ctx))
        r["priced_us"] = cm.forward(shape, graph=False, carry_over=False).attention_us / cm.layers


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="llama3_8b")
    ap.add_argument("--out", default=None)
    ap.add_argument("--small", action="store_true", help="CPU smoke test: tiny model and sizes")
    args = ap.parse_args(argv)
    import torch

    if args.small:
        model, queries, contexts, copies, where = "tiny", (4, 16), (64, 256), 2, "CPU"
    elif not torch.cuda.is_available():
        sys.exit("bench_continuation: needs a CUDA GPU (the runtime's kernels); --small on a CPU")
    else:
        model, queries, contexts, copies = args.model, QUERIES, CONTEXTS, COPIES
        where = torch.cuda.get_device_name()
    rows = measure(model, queries, contexts, copies)
    priced(model, rows)
    print(f"# {where}, model={model}, one layer, us")
    head = ("q", "ctx", "masked", "rows", "priced", "rows/masked", "diff")
    print(" ".join(f"{h:>11}" for h in head))
    for r in rows:
        cells = (r["masked_us"], r["rows_us"], r["priced_us"], r["rows_us"] / r["masked_us"])
        print(
            f"{r['q']:>11} {r['ctx']:>11} "
            + " ".join(f"{c:>11.2f}" for c in cells)
            + f" {r['diff']:>11.2g}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"model": model, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
