"""Record the runtime's reference runs on a GPU: gzip'd traces, metrics, command, hardware.

    PYTHONUNBUFFERED=1 python experiments/runtime/record.py OUTDIR CASE [CASE ...] [--overhead]
        [--kineto] [--set KEY=VALUE ...]

Each CASE (see CASES) runs the sync and the async engine in this one process, on the same model
config and workload, and writes OUTDIR/CASE/{trace_sync,trace_async}.json.gz and metrics.json
(metrics of each trace, the runtime's counters, the command line, the hardware). --overhead runs
the async engine on seed_512 with tracing on and off (twice each, alternating) and records the
wall-time difference (the tracing overhead). --kineto writes a small torch.profiler chrome trace of a few
async steps to OUTDIR/kineto_runtime_async.json.gz.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_module

from cbsim.config.store import load_config, register_configs
from cbsim.metrics import compute_metrics
from cbsim.trace import write_trace

SEED = ["model=llama3_8b", "workload.batch_size=32", "workload.prompt_len=256"]
CASES = {
    # the brief's shape at 1024 new tokens
    "seed_1024": [*SEED, "workload.gen_len=1024"],
    # the brief's shape at its full 8192 new tokens
    "seed_8192": [*SEED, "workload.gen_len=8192"],
    # a small batch: little GPU work per step, host overhead matters most
    "small_batch": [
        "model=llama3_8b",
        "workload.batch_size=4",
        "workload.prompt_len=256",
        "workload.gen_len=1024",
    ],
    # long prompts: chunked prefill of 8K-token prompts, then decode over long contexts
    "long_prompt": [
        "model=llama3_8b",
        "workload.batch_size=8",
        "workload.prompt_len=8192",
        "workload.gen_len=256",
        "workload.max_batch_tokens=8192",
    ],
    # cross-shape validation (h200_run6): a mid batch at a longer generation
    "batch_16_2048": [
        "model=llama3_8b",
        "workload.batch_size=16",
        "workload.prompt_len=512",
        "workload.gen_len=2048",
    ],
    # a batch twice the seed's: more rows per GEMM, twice the live KV
    "batch_64": [
        "model=llama3_8b",
        "workload.batch_size=64",
        "workload.prompt_len=256",
        "workload.gen_len=1024",
    ],
    # continuous batching proper: three waves of requests of spread lengths through 32 seats,
    # prefill chunks mixed into decode steps (eager) all along
    "continuous": [
        "model=llama3_8b",
        "workload.batch_size=32",
        "workload.num_requests=96",
        "workload.prompt_len=512",
        "workload.prompt_dist=lognormal",
        "workload.prompt_spread=0.5",
        "workload.gen_len=512",
        "workload.gen_dist=uniform",
        "workload.gen_spread=0.5",
        "workload.max_batch_tokens=2048",
    ],
    # the seed shape at 512 new tokens: the tracing-overhead measurement (--overhead)
    "seed_512": [*SEED, "workload.gen_len=512"],
    # the tiny model (a smoke test of the recorder itself)
    "tiny": [
        "model=tiny",
        "workload.batch_size=8",
        "workload.prompt_len=32",
        "workload.gen_len=64",
    ],
}


_MODELS: dict = {}


def shared_model(config):
    """One model per model config in this process (building 8B random weights takes a while);
    fused as the runtime fuses its own on CUDA."""
    import torch

    from cbsim.runtime.kernels.fused_projections import fuse_qkv_and_gate_up
    from cbsim.runtime.model import build_model

    key = (config.model.name, config.workload.seed)
    if key not in _MODELS:
        _MODELS.clear()
        model = build_model(config.model, torch.device(config.mode.device), seed=key[1])
        if config.mode.device.startswith("cuda"):
            if config.mode.fuse_projections:
                fuse_qkv_and_gate_up(model)
            if config.mode.fuse_norm_rope:
                from cbsim.runtime.kernels.fused_elementwise import fuse_norm_and_rope

                fuse_norm_and_rope(model)
        _MODELS[key] = model
    return _MODELS[key]


def make_config(overrides: list[str]):
    register_configs()
    with initialize_config_module(config_module="cbsim.conf", version_base="1.3"):
        return load_config(compose(config_name="config", overrides=overrides))


def summarize(m: dict) -> str:
    return (
        f"{m['engine']:>5}: {m['step_time_ms_mean']:.3f} ms/step, "
        f"{m['tokens_per_s']:.0f} tok/s, GPU idle {m['gpu_idle_fraction']:.3%}, "
        f"forward {m['gpu_forward_ms_mean']:.3f} ms, host "
        f"{sum(v for k, v in m['host_ms_per_step'].items() if k != 'wait'):.3f} ms/step"
    )


def run_case(name: str, out: Path, extra: list[str], hardware: dict) -> dict:
    import torch

    from cbsim.runtime.engine import execute

    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    result = {"case": name, "command": " ".join(sys.argv), "runs": {}}
    outputs: dict = {}
    for engine in ("sync", "async"):
        overrides = ["mode=runtime", f"engine={engine}", *CASES[name], *extra]
        config = make_config(overrides)
        res = execute(config, engine, model=shared_model(config))
        trace = res.trace
        trace.other_data["config_overrides"] = overrides
        write_trace(trace, d / f"trace_{engine}.json.gz")
        m = compute_metrics(trace)
        hardware.update(trace.other_data["hardware"])
        result["runs"][engine] = {
            "overrides": overrides,
            "metrics": m,
            "counters": res.summary,
            "memory": trace.other_data["memory"],
            "attention": trace.other_data["attention"],
            "clock_drift_us": trace.other_data.get("clock_drift_us"),
        }
        print(
            f"[{name}] {summarize(m)}; wall {res.summary['wall_s']:.2f} s; "
            f"memory {trace.other_data['memory']}",
            flush=True,
        )
        outputs[engine] = res.outputs
        del res, trace
        gc.collect()
        torch.cuda.empty_cache()
    same = [np.array_equal(v, outputs["async"].get(k)) for k, v in outputs["sync"].items()]
    result["async_tokens_equal_sync"] = f"{sum(same)} of {len(same)} requests"
    print(f"[{name}] greedy tokens async == sync: {result['async_tokens_equal_sync']}", flush=True)
    s, a = (result["runs"][e]["metrics"] for e in ("sync", "async"))
    result["speedup"] = s["total_time_s"] / a["total_time_s"]
    print(
        f"[{name}] async speedup x{result['speedup']:.3f}; GPU idle "
        f"{s['gpu_idle_fraction']:.2%} -> {a['gpu_idle_fraction']:.2%}",
        flush=True,
    )
    return result


def tracing_overhead(name: str, extra: list[str]) -> dict:
    """The same async run with tracing on and off (twice each, alternating): wall time."""
    from cbsim.runtime.engine import execute

    walls: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(2):
        for flag in ("on", "off"):
            over = [
                "mode=runtime",
                "engine=async",
                *CASES[name],
                *extra,
                f"mode.tracing={'true' if flag == 'on' else 'false'}",
            ]
            config = make_config(over)
            res = execute(config, "async", model=shared_model(config))
            walls[flag].append(res.summary["wall_s"])
            del res
            gc.collect()
    on, off = min(walls["on"]), min(walls["off"])
    out = {
        "case": name,
        "wall_on_s": walls["on"],
        "wall_off_s": walls["off"],
        "overhead_fraction": (on - off) / off,
    }
    print(
        f"[overhead] tracing on {walls['on']} s, off {walls['off']} s: "
        f"{out['overhead_fraction']:.3%}",
        flush=True,
    )
    return out


def kineto(out: Path) -> None:
    """A few async steps of a small model under torch.profiler, as a gzip'd chrome trace."""
    import gzip
    import os

    import torch
    from torch.profiler import ProfilerActivity, profile

    from cbsim.runtime.engine import execute

    over = [
        "mode=runtime",
        "engine=async",
        "model=llama3_1b",
        "workload.batch_size=8",
        "workload.prompt_len=64",
        "workload.gen_len=12",
    ]
    config = make_config(over)
    execute(config, "async")  # warm: allocator, Triton, cuBLAS
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        execute(config, "async")
    raw = out / "kineto_runtime_async.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as f, open(str(raw) + ".gz", "wb") as dst:
        with gzip.GzipFile(fileobj=dst, mode="wb", mtime=0) as g:
            g.write(f.read())
    os.remove(raw)
    torch.cuda.synchronize()
    print(f"[kineto] {raw}.gz {os.path.getsize(str(raw) + '.gz')} bytes; overrides {over}")


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    cases = [a for a in argv[1:] if a in CASES]
    extra = [a.split("=", 1)[1] for a in argv if a.startswith("--set=")]
    hardware: dict = {}
    results = {
        "command": " ".join(sys.argv),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if "--kineto" in argv:
        try:
            kineto(out)
        except Exception as exc:
            print(f"[kineto] FAILED: {exc!r}", flush=True)
    for name in cases:
        try:
            results[name] = run_case(name, out, extra, hardware)
        except Exception as exc:  # keep the other cases
            print(f"[{name}] FAILED: {exc!r}", flush=True)
            results[name] = {"error": repr(exc)}
        (out / "results.json").write_text(
            json.dumps({**results, "hardware": hardware}, indent=2, default=str)
        )
    if "--overhead" in argv:
        try:
            results["tracing_overhead"] = tracing_overhead("seed_512", extra)
        except Exception as exc:
            print(f"[overhead] FAILED: {exc!r}", flush=True)
    results["hardware"] = hardware
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
