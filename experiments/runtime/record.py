"""Record the runtime's reference runs on a GPU: gzip'd traces, metrics, command, hardware.

    PYTHONUNBUFFERED=1 python experiments/runtime/record.py OUTDIR [CASE ...] [--part=NAME]
        [--overhead] [--kineto] [--set=KEY=VALUE ...] [--deadline-s=S]

Each CASE (experiments/runtime/cases.py: CASES) or every case of a matrix part (MATRIX, the
reference workload first) runs the sync and then the async engine through
`cbsim.runtime.run`, the very function `python -m cbsim mode=runtime` calls (each run builds
its own model, warms up and handles the collector itself; nothing here is harness-only), and
writes OUTDIR/CASE/{trace_sync,trace_async}.json.gz and OUTDIR/results.json (metrics of each
trace, the runtime's counters, the overrides, the hardware). A case is not started past
--deadline-s. --overhead: the async engine on seed_512 with tracing on and off, twice each,
alternating (the tracing overhead). --kineto: a small torch.profiler chrome trace of a few async
steps in OUTDIR/kineto_runtime_async.json.gz.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from hydra import compose, initialize_config_module

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cases import CASES, MATRIX, REFERENCE, REFERENCE_CASE, part_cases  # noqa: E402

from cbsim.config.store import load_config, register_configs  # noqa: E402
from cbsim.metrics import compute_metrics  # noqa: E402
from cbsim.trace import write_trace  # noqa: E402


def make_config(overrides: list[str]):
    register_configs()
    with initialize_config_module(config_module="cbsim.conf", version_base="1.3"):
        return load_config(compose(config_name="config", overrides=overrides))


def summarize(m: dict) -> str:
    host = sum(v for k, v in m["host_ms_per_step"].items() if k != "wait")
    return (
        f"{m['engine']:>5}: {m['step_time_ms_mean']:.3f} ms/step, "
        f"{m['tokens_per_s']:.0f} tok/s, GPU idle {m['gpu_idle_fraction']:.3%}, "
        f"forward {m['gpu_forward_ms_mean']:.3f} ms, host {host:.3f} ms/step, "
        f"stalls {m.get('host_stalls')}"
    )


def run_case(name: str, case: list[str], out: Path, extra: list[str], hardware: dict) -> dict:
    from cbsim.runtime import run

    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    result: dict = {"case": name, "runs": {}}
    for engine in ("sync", "async"):
        overrides = ["mode=runtime", f"engine={engine}", *case, *extra]
        trace = run(make_config(overrides), engine)
        trace.other_data["config_overrides"] = overrides
        write_trace(trace, d / f"trace_{engine}.json.gz")
        m = compute_metrics(trace)
        hardware.update(trace.other_data["hardware"])
        counters = trace.other_data["counters"]
        result["runs"][engine] = {
            "overrides": overrides,
            "metrics": m,
            "counters": counters,
            "memory": trace.other_data["memory"],
            "attention": trace.other_data["attention"],
            "clock_drift_us": trace.other_data.get("clock_drift_us"),
        }
        print(
            f"[{name}] {summarize(m)}; wall {counters['wall_s']:.2f} s, "
            f"set-up {counters['setup_s']:.1f} s",
            flush=True,
        )
    s, a = (result["runs"][e]["metrics"] for e in ("sync", "async"))
    result["speedup"] = s["total_time_s"] / a["total_time_s"]
    print(
        f"[{name}] async speedup x{result['speedup']:.3f}; GPU idle "
        f"{s['gpu_idle_fraction']:.2%} -> {a['gpu_idle_fraction']:.2%}",
        flush=True,
    )
    return result


def tracing_overhead(extra: list[str]) -> dict:
    """The same async run with tracing on and off (twice each, alternating): wall time."""
    from cbsim.runtime import run

    walls: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(2):
        for flag in ("on", "off"):
            over = ["mode=runtime", "engine=async", *CASES["seed_512"], *extra]
            over.append(f"mode.tracing={'true' if flag == 'on' else 'false'}")
            walls[flag].append(run(make_config(over), "async").other_data["counters"]["wall_s"])
    on, off = min(walls["on"]), min(walls["off"])
    out = {
        "wall_on_s": walls["on"],
        "wall_off_s": walls["off"],
        "overhead_fraction": (on - off) / off,
    }
    print(
        f"[overhead] tracing on {walls['on']} s, off {walls['off']} s: {out['overhead_fraction']:.3%}"
    )
    return out


def kineto(out: Path) -> None:
    """A few async steps of a small model under torch.profiler, as a gzip'd chrome trace."""
    import gzip
    import os

    import torch
    from torch.profiler import ProfilerActivity, profile

    from cbsim.runtime import run

    over = ["mode=runtime", "engine=async", "model=llama3_1b", "workload.batch_size=8"]
    over += ["workload.prompt_len=64", "workload.gen_len=12"]
    config = make_config(over)
    run(config, "async")  # warm: allocator, Triton, cuBLAS
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run(config, "async")
    raw = out / "kineto_runtime_async.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as f, open(str(raw) + ".gz", "wb") as dst:
        with gzip.GzipFile(fileobj=dst, mode="wb", mtime=0) as g:
            g.write(f.read())
    os.remove(raw)
    torch.cuda.synchronize()
    print(f"[kineto] {raw}.gz {os.path.getsize(str(raw) + '.gz')} bytes; overrides {over}")


def utc_now() -> str:
    """The wall clock as nvidia-smi's samples carry it (UTC, to the microsecond)."""
    return datetime.now(timezone.utc).strftime("%H:%M:%S.%f")


def selected(argv: list[str]) -> dict[str, list[str]]:
    """The cases named (CASES, the reference, any matrix part's) and every case of --part=."""
    named = {**CASES, REFERENCE: REFERENCE_CASE[0]}
    for part in MATRIX.values():
        named.update({k: v[0] for k, v in part.items()})
    cases = {}
    for a in argv[1:]:
        if a.startswith("--"):
            continue
        if a not in named:
            raise SystemExit(f"unknown case {a!r}; allowed: {', '.join(sorted(named))}")
        cases[a] = named[a]
    for a in argv:
        if a.startswith("--part="):
            cases.update(part_cases(a.split("=", 1)[1]))
    return cases


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    extra = [a.split("=", 1)[1] for a in argv if a.startswith("--set=")]
    deadline = next((float(a.split("=")[1]) for a in argv if a.startswith("--deadline-s=")), 1e9)
    t0 = time.perf_counter()
    hardware: dict = {}
    results: dict = {
        "command": " ".join(sys.argv),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if "--kineto" in argv:
        try:
            kineto(out)
        except Exception as exc:
            print(f"[kineto] FAILED: {exc!r}", flush=True)
    for name, case in selected(argv).items():
        if time.perf_counter() - t0 > deadline:
            print(f"[{name}] skipped: past the deadline of {deadline:.0f} s", flush=True)
            results[name] = {"skipped": "deadline"}
            continue
        print(f"== {utc_now()} start {name}", flush=True)  # for clock_summary.py
        try:
            results[name] = run_case(name, case, out, extra, hardware)
        except Exception as exc:  # keep the other cases
            print(f"[{name}] FAILED: {exc!r}", flush=True)
            results[name] = {"error": repr(exc)}
        print(f"== {utc_now()} end {name}", flush=True)
        (out / "results.json").write_text(
            json.dumps({**results, "hardware": hardware}, indent=2, default=str)
        )
    if "--overhead" in argv:
        try:
            results["tracing_overhead"] = tracing_overhead(extra)
        except Exception as exc:
            print(f"[overhead] FAILED: {exc!r}", flush=True)
    results["hardware"] = hardware
    results["elapsed_s"] = time.perf_counter() - t0
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
