"""Where an eager step's host time goes the first time its shape is seen in a process.

    python experiments/runtime/diag_new_shapes.py OUTDIR [PART ...]   (default: all three)

The online recordings' eager mixed steps (h200_run21: 1b_poisson_96, 3b_poisson_64,
8b_poisson_32) launch 4-10 ms slower in the sync run, which runs first in record.py's process,
than the async run's steps whose token count the sync run had already seen. Three parts, one
process:

- ``ops``: host time of one call of the kernels an eager step is made of, at a shape new to the
  process and again at the same shape: the 1B's GEMMs (cuBLAS and cuBLASLt), the prefill SDPA
  and the Triton decode kernel, each at fresh row counts;
- ``order``: the 1B online case run sync, async, sync, async through ``cbsim.runtime.run`` (as
  ``python -m cbsim mode=runtime``), traces kept, eager launches summarized: if the second sync
  run is as quick as the async ones, the first run's excess is the new shapes, not the engine;
- ``profile``: a 3B online run (shapes this process has not seen) under torch.profiler (CPU),
  each op's self time at its first (name, input shapes) against its repeats.

Writes OUTDIR/diag_new_shapes.json, the traces under OUTDIR/order/, prints tables.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cases import poisson  # noqa: E402
from record import make_config  # noqa: E402

ORDER_CASE = poisson("llama3_1b", 96, 192, 50.0, 256, 512)
PROFILE_CASE = poisson("llama3_3b", 32, 48, 40.0, 384, 96)
FRESH = 24  # fresh shapes per kernel in ``ops``


def host_us(fn) -> float:
    """Host time of one call, the GPU idle before it."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e6


def first_and_again(make, sizes) -> dict:
    """Median host time of ``make(n)()`` at each new size, then at the same size again."""
    first, again = [], []
    for n in sizes:
        call = make(n)
        first.append(host_us(call))
        again.append(host_us(call))
    return {"first_us": statistics.median(first), "again_us": statistics.median(again)}


def fresh_sizes(rng, lo: int, hi: int, used: set) -> list[int]:
    out = []
    while len(out) < FRESH:
        n = int(rng.integers(lo, hi))
        if n not in used:
            used.add(n)
            out.append(n)
    return out


def ops() -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    from cbsim.runtime.attention import PREFILL_BACKENDS, load_decode_kernel
    from cbsim.runtime.runner import runtime_model

    dev = torch.device("cuda")
    config = make_config(["mode=runtime", "engine=sync", *ORDER_CASE])
    model = runtime_model(config, dev, None)
    shapes = sorted({tuple(m.weight.shape) for m in model.modules() if hasattr(m, "in_features")})
    rng, used, out = np.random.default_rng(0), set(), {}
    x = torch.randn(2048, 16384, device=dev, dtype=torch.bfloat16)
    for lib in ("cublas", "cublaslt"):
        torch.backends.cuda.preferred_blas_library(lib)
        for n_out, k in shapes:
            w = torch.randn(n_out, k, device=dev, dtype=torch.bfloat16)
            F.linear(x[:64, :k], w)  # the library's own first use
            sizes = fresh_sizes(rng, 257, 2048, used)
            out[f"linear {lib} {n_out}x{k}"] = first_and_again(
                lambda m, w=w, k=k: lambda: F.linear(x[:m, :k], w), sizes
            )
    torch.backends.cuda.preferred_blas_library(config.mode.blas)
    hq, hkv, d = 32, 8, 64

    def sdpa(m):
        q = torch.randn(1, hq, m, d, device=dev, dtype=torch.bfloat16)
        kv = torch.randn(1, hkv, m, d, device=dev, dtype=torch.bfloat16)

        def call():
            with sdpa_kernel(PREFILL_BACKENDS):
                F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)

        return call

    out["sdpa prefill"] = first_and_again(sdpa, fresh_sizes(rng, 100, 2000, set()))
    kernel = load_decode_kernel("triton", dev)
    kc = torch.randn(4096, 16, hkv, d, device=dev, dtype=torch.bfloat16)

    def decode(b):
        q = torch.randn(b, hq, d, device=dev, dtype=torch.bfloat16)
        bt = torch.randint(0, 4096, (b, 64), device=dev, dtype=torch.int32)
        ctx = torch.randint(1, 1024, (b,), device=dev, dtype=torch.int32)
        return lambda: kernel(q, kc, kc, bt, ctx, d**-0.5)

    decode(8)()  # compile
    out["triton decode"] = first_and_again(decode, fresh_sizes(rng, 9, 255, set()))
    for name, r in out.items():
        print(f"[ops] {name:<36} first {r['first_us']:>9.1f} us   again {r['again_us']:>9.1f} us")
    return out


def eager_launches(trace) -> dict:
    """Median launch of the run's eager steps, and their count."""
    import numpy as np

    spans = trace.spans
    fwd = spans[spans.name == "forward"].step
    launch = spans[(spans.name == "launch") & spans.step.isin(fwd)]
    return {"eager_steps": int(len(launch)), "eager_launch_ms": float(np.median(launch.dur)) / 1e3}


def order(out: Path) -> list:
    from cbsim.metrics import compute_metrics
    from cbsim.runtime import run
    from cbsim.trace import write_trace

    rows = []
    (out / "order").mkdir(parents=True, exist_ok=True)
    for i, engine in enumerate(("sync", "async", "sync", "async")):
        overrides = ["mode=runtime", f"engine={engine}", *ORDER_CASE]
        trace = run(make_config(overrides), engine)
        trace.other_data["config_overrides"] = overrides
        write_trace(trace, out / "order" / f"run{i}_{engine}.json.gz")
        m = compute_metrics(trace)
        row = {"run": i, "engine": engine, "total_s": m["total_time_s"], **eager_launches(trace)}
        rows.append(row)
        print(
            f"[order] {i} {engine:<6} total {row['total_s']:.3f} s, {row['eager_steps']} eager "
            f"steps, median launch {row['eager_launch_ms']:.2f} ms",
            flush=True,
        )
    return rows


def profile() -> list:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from cbsim.runtime import run

    config = make_config(["mode=runtime", "engine=sync", *PROFILE_CASE])
    with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        run(config, "sync")
    torch.cuda.synchronize()
    seen: set = set()
    by_name: dict[str, dict] = {}
    for ev in sorted(prof.events(), key=lambda e: e.time_range.start):
        key = (ev.name, str(ev.input_shapes))
        r = by_name.setdefault(ev.name, {"first": [], "again": []})
        r["again" if key in seen else "first"].append(ev.self_cpu_time_total)
        seen.add(key)
    rows = []
    for name, r in by_name.items():
        if len(r["first"]) < 3 or len(r["again"]) < 3:
            continue
        first, again = statistics.mean(r["first"]), statistics.mean(r["again"])
        rows.append(
            {
                "name": name,
                "first_n": len(r["first"]),
                "first_us": first,
                "again_n": len(r["again"]),
                "again_us": again,
                "excess_ms": (first - again) * len(r["first"]) / 1e3,
            }
        )
    rows.sort(key=lambda r: -r["excess_ms"])
    for r in rows[:25]:
        print(
            f"[profile] {r['name'][:44]:<44} first {r['first_n']:>6} x {r['first_us']:>8.1f} us"
            f"  again {r['again_n']:>7} x {r['again_us']:>8.1f} us  excess {r['excess_ms']:>8.1f} ms"
        )
    return rows[:60]


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    result = {}
    parts = {"ops": ops, "order": lambda: order(out), "profile": profile}
    for part, fn in parts.items():
        if argv[1:] and part not in argv[1:]:
            continue
        t0 = time.perf_counter()
        try:
            result[part] = fn()
        except Exception as exc:  # keep the other parts
            print(f"[{part}] FAILED: {exc!r}", flush=True)
            result[part] = {"error": repr(exc)}
        print(f"[{part}] {time.perf_counter() - t0:.1f} s", flush=True)
        (out / "diag_new_shapes.json").write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
