"""Why do long_prompt's steps 3-7 (an 8192-token prompt beside 3-7 decode rows) take 3x steps 0-2
(beside 0-2 decode rows)? h200_run7: 252-256 ms vs 814-832 ms per forward.

    PYTHONUNBUFFERED=1 python experiments/runtime/diag_prefill.py OUTDIR

1. The Llama-3-8B GEMMs (fused q/k/v, o, fused gate/up, down) at M = 8190..8200 rows, bf16,
   CUDA-event timed (median of 10), with the cuBLAS kernel chosen (from the profiler).
2. The long_prompt sync run under torch.profiler: per step, GPU time summed by kernel name;
   the top kernels of steps 2 and 3 side by side.
Writes OUTDIR/diag_prefill.json.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import CASES, make_config, shared_model  # noqa: E402

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}


def gemm_times() -> dict:
    out = {}
    for name, (k, n) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        for m in (8190, 8191, 8192, 8193, 8194, 8195, 8196, 8197, 8199, 8200, 8208):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            for _ in range(3):
                torch.nn.functional.linear(x, w)
            times = []
            for _ in range(10):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                torch.nn.functional.linear(x, w)
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            out[f"{name}_M{m}"] = sorted(times)[5]
        print(
            f"[gemm] {name}: "
            + ", ".join(
                f"{m}:{out[f'{name}_M{m}']:.3f}" for m in (8192, 8193, 8194, 8195, 8196, 8200, 8208)
            ),
            flush=True,
        )
    return out


def step_kernels(out_dir: Path) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from cbsim.runtime.engine import execute

    over = [
        "mode=runtime",
        "engine=sync",
        *CASES["long_prompt"],
        "workload.batch_size=5",
        "workload.gen_len=8",
    ]
    config = make_config(over)
    model = shared_model(config)
    execute(config, "sync", model=model)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        execute(config, "sync", model=model)
    raw = out_dir / "kineto_long_prompt_sync.json"
    prof.export_chrome_trace(str(raw))
    ev = json.loads(raw.read_text())["traceEvents"]
    raw.unlink()
    # host ranges "forward#<step>"; their launches (runtime/driver calls inside the range); the
    # kernels, memsets and copies those launched (by correlation id)
    ranges = [
        e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("forward#")
    ]
    calls = [e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    owner = {}
    for r in ranges:
        for c in calls:
            if r["ts"] <= c["ts"] <= r["ts"] + r["dur"]:
                owner[c["args"].get("correlation")] = r["name"]
    per_step: dict[str, dict[str, float]] = {}
    for e in ev:
        if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy"):
            step = owner.get(e.get("args", {}).get("correlation"))
            if step is not None:
                per_step.setdefault(step, defaultdict(float))[e["name"][:90]] += e["dur"] / 1e3
    summary = {}
    for name in sorted(per_step):
        top = sorted(per_step[name].items(), key=lambda kv: -kv[1])[:8]
        summary[name] = {"total_ms": sum(per_step[name].values()), "top_ms": top}
        print(f"[step] {name}: {summary[name]['total_ms']:.1f} ms", flush=True)
        for k, v in top:
            print(f"    {v:9.2f}  {k}", flush=True)
    return {"overrides": over, "steps": summary}


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    result = {"gemm_ms": gemm_times()}
    try:
        result["steps"] = step_kernels(out)
    except Exception as exc:
        print(f"[step] FAILED: {exc!r}", flush=True)
    (out / "diag_prefill.json").write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
