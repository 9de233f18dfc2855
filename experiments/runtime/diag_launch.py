"""Why does an eager prefill block the host inside its launch? Two measurements on one GPU.

    PYTHONUNBUFFERED=1 python experiments/runtime/diag_launch.py OUTDIR [--queue] [--prefill]
        [--kernels] [--set=KEY=VALUE ...]

1. The launch-queue depth: one stream busy in `torch.cuda._sleep`, then a few thousand one-kernel
   ops launched behind it; the host time of each launch shows after how many pending kernels
   `cudaLaunchKernel` starts to block (the driver's queue is full).
2. An eager 8192-token prefill of the Llama-3-8B shape (the runtime's sync engine) under
   torch.profiler: kernels per forward, and every runtime call that can block the host
   (cudaMalloc/cudaFree/synchronize), with counts and host time.
3. (--kernels) A short continuous-batching run (async) under torch.profiler: kernels per forward
   by step kind (decode graph, eager prefill, eager mixed), for the simulator's kernel counts.
Writes OUTDIR/diag_launch.json and the profiler traces OUTDIR/kineto_*.json.gz.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import make_config  # noqa: E402


def queue_depth(ops: int = 6000, sleep_cycles: int = 4_000_000_000) -> dict:
    """Host microseconds of each launch behind a long-running kernel."""
    x = torch.zeros(1024, device="cuda")
    stream = torch.cuda.Stream()
    out = {}
    for name, op in (("add_", lambda: x.add_(1.0)), ("mul_", lambda: x.mul_(1.0))):
        for _ in range(3):
            op()
        torch.cuda.synchronize()
        times = []
        with torch.cuda.stream(stream):
            torch.cuda._sleep(sleep_cycles)
            for _ in range(ops):
                t = time.perf_counter()
                op()
                times.append((time.perf_counter() - t) * 1e6)
        torch.cuda.synchronize()
        first_block = next((i for i, t in enumerate(times) if t > 1000.0), None)
        out[name] = {
            "launches": ops,
            "first_blocking_launch": first_block,
            "median_us_before": sorted(times[: first_block or ops])[(first_block or ops) // 2],
            "max_us": max(times),
            "blocking_launches_over_1ms": sum(t > 1000.0 for t in times),
        }
        print(f"[queue] {name}: {out[name]}", flush=True)
    return out


def prefill_profile(out_dir: Path) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from cbsim.metrics import compute_metrics
    from cbsim.runtime.engine import execute
    from cbsim.trace.kineto import import_kineto

    over = [
        "mode=runtime",
        "engine=sync",
        "model=llama3_8b",
        "workload.batch_size=2",
        "workload.prompt_len=8192",
        "workload.gen_len=4",
        "workload.max_batch_tokens=8192",
    ]
    config = make_config(over)
    from cbsim.runtime.runner import runtime_model

    model = runtime_model(config, torch.device("cuda"), None)
    res = execute(config, "sync", model=model)  # warm, and the traced launch/forward
    f = res.trace.span_frame()
    pre = f[(f.query_tokens > 1000)]
    steps = {}
    for s, d in pre.groupby("step"):
        steps[int(s)] = {r.name: round(r.dur / 1e3, 3) for r in d.itertuples()}
    print(f"[prefill] traced (ms): {steps}", flush=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        execute(config, "sync", model=model)
    raw = out_dir / "kineto_prefill_sync.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(str(raw) + ".gz", "wb") as dst:
        dst.write(src.read())
    os.remove(raw)
    runtime_calls = {}
    for ev in prof.key_averages():
        n = ev.key
        if n.startswith(("cuda", "cu")) and ev.count:
            runtime_calls[n] = {"count": ev.count, "host_ms": round(ev.cpu_time_total / 1e3, 3)}
    print(f"[prefill] runtime calls: {runtime_calls}", flush=True)
    trace = import_kineto(str(raw) + ".gz")
    kf = trace.span_frame({"kernels": 0})
    fwd = kf[kf.lane == "compute"][["name", "dur", "kernels"]]
    print(f"[prefill] profiled forwards:\n{fwd.to_string()}", flush=True)
    return {
        "overrides": over,
        "traced_prefill_steps_ms": steps,
        "metrics": compute_metrics(res.trace),
        "runtime_calls": runtime_calls,
        "profiled_forwards": fwd.to_dict("records"),
    }


# --set=KEY=VALUE arguments: more overrides for the --kernels run (e.g. mode.fuse_epilogues=false)
SETS = [a.removeprefix("--set=") for a in sys.argv if a.startswith("--set=")]
MIXED = [
    "mode=runtime",
    "engine=async",
    "model=llama3_8b",
    "workload.batch_size=32",
    "workload.num_requests=48",
    "workload.prompt_len=512",
    "workload.prompt_dist=lognormal",
    "workload.prompt_spread=0.5",
    "workload.gen_len=48",
    "workload.gen_dist=uniform",
    "workload.gen_spread=0.5",
    "workload.max_batch_tokens=2048",
]


def kernels_per_kind(out_dir: Path) -> dict:
    """Kernels (and memsets/copies) on the compute stream per forward, by step kind, from a
    profiled short continuous-batching run (async: decode graphs, eager prefill/mixed steps)."""
    from torch.profiler import ProfilerActivity, profile

    from cbsim.runtime.engine import execute
    from cbsim.runtime.runner import runtime_model
    from cbsim.trace.kineto import import_kineto

    config = make_config(MIXED + SETS)
    model = runtime_model(config, torch.device("cuda"), None)  # built and fused as the CLI does
    execute(config, "async", model=model)  # warm
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        res = execute(config, "async", model=model)
    raw = out_dir / "kineto_mixed_async.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(str(raw) + ".gz", "wb") as dst:
        dst.write(src.read())
    os.remove(raw)
    k = import_kineto(str(raw) + ".gz").span_frame({"kernels": 0})
    k = k[(k.lane == "compute") & k.name.isin(["forward", "graph_replay"])].reset_index(drop=True)
    from cbsim.calibration.recordings import replay_batches

    f = res.trace.span_frame()
    steps = f[f.lane == "compute"].sort_values("step").reset_index(drop=True)
    batches = replay_batches(config, "async") or {}
    rows = []
    for i in range(min(len(k), len(steps))):
        st = steps.iloc[i]
        q, ctx = batches.get(int(st.step), (None, None))
        # the step's attention groups: decode rows, prompt chunks from 0, chunks after a prefix
        groups = "?"
        if q is not None:
            start = ctx - q
            groups = "+".join(
                g
                for g, on in (
                    ("dec", (q == 1).any()),
                    ("pre", ((q > 1) & (start == 0)).any()),
                    ("ext", ((q > 1) & (start > 0)).any()),
                )
                if on
            )
        rows.append(
            {
                "step": int(st.step),
                "kind": st.kind,
                "groups": groups,
                "graph": k.name[i] == "graph_replay",
                "requests": int(st.requests),
                "query_tokens": int(st.query_tokens),
                "kernels": int(k.kernels[i]),
            }
        )
    import pandas as pd

    table = pd.DataFrame(rows)
    summary = table.groupby(["kind", "groups", "graph"]).kernels.describe()
    print(f"[kernels] per forward by kind:\n{summary.to_string()}", flush=True)
    return {
        "overrides": MIXED + SETS,
        "per_step": rows,
        "summary": summary.reset_index().to_dict("records"),
    }


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    if "--queue" in sys.argv:
        result["queue_depth"] = queue_depth()
    if "--prefill" in sys.argv:
        try:
            result["prefill"] = prefill_profile(out)
        except Exception as exc:
            print(f"[prefill] FAILED: {exc!r}", flush=True)
            result["prefill"] = {"error": repr(exc)}
    if "--kernels" in sys.argv:
        try:
            result["kernels"] = kernels_per_kind(out)
        except Exception as exc:
            print(f"[kernels] FAILED: {exc!r}", flush=True)
            result["kernels"] = {"error": repr(exc)}
    (out / "diag_launch.json").write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
