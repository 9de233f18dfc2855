"""Peak memory of a simulation with its trace kept and without: does it grow with the steps
or with the requests?

    python benchmarks/bench_sim_memory.py           # the rows below (about 80 s, 2 cores)
    python benchmarks/bench_sim_memory.py --quick   # the smaller of each pair

Each row runs in a fresh interpreter: one engine (async, llama3_1b on the h200 profile, Hydra's
defaults otherwise) simulated and measured, with its trace built (``want_trace=True`` and
``compute_metrics``: what a run writing its trace or its report holds) or without one (its spans
folded as it runs, cbsim.trace.fold: what a run with output.trace=false output.report=false and a
band's draws hold). "wall s" is the simulation and its metrics, not the interpreter's start;
"peak MB" is the process's peak RSS; "over start MB" is that less the RSS before the run (the
interpreter, numpy, pandas and the config). "same" says both ways gave the same p99 ITL (1e-9).
The "many requests" rows (short requests in large batches: few steps, many requests) run without a
trace only; the line under the table is their peak's growth per request, the figure
cbsim/sizing.py's SIM_BYTES_PER_REQUEST comes from; "long prompts" is the first of them with
1,008-token prompts, and its line the growth per KV block (SIM_BYTES_PER_KV_BLOCK).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE = ("model=llama3_1b", "engine=async", "mode.bands=false")
# (label, overrides): a batch of 4 at two lengths; an online workload (Poisson arrivals, EOS)
# at two sizes
ONLINE = ("workload.arrival=poisson", "workload.rate=150", "workload.gen_len=256")
ONLINE += ("workload.gen_spread=0.5", "workload.ignore_eos=false")
# short requests in large batches: the steps are few, the requests many
MANY = ("workload.gen_len=4", "workload.batch_size=4096", "workload.max_batch_tokens=65536")
ROWS = [
    ("batch of 4", ("workload.batch_size=4", "workload.num_requests=4", "workload.gen_len=20000")),
    ("batch of 4", ("workload.batch_size=4", "workload.num_requests=4", "workload.gen_len=80000")),
    ("online", (*ONLINE, "workload.num_requests=2000")),
    ("online", (*ONLINE, "workload.num_requests=8000")),
    ("many requests", (*MANY, "workload.prompt_len=16", "workload.num_requests=50000")),
    ("many requests", (*MANY, "workload.prompt_len=16", "workload.num_requests=200000")),
    ("long prompts", (*MANY, "workload.prompt_len=1008", "workload.num_requests=50000")),
]
QUICK = (0, 2, 4)
UNTRACED_ONLY = ("many requests", "long prompts")  # a trace of 800K instants: not the question


def one(keep: bool, overrides: list[str]) -> dict:
    """In this interpreter: one simulation and its metrics; what it measured."""
    import resource

    from hydra import compose, initialize_config_module

    from cbsim.config.store import load_config, register_configs
    from cbsim.metrics import MetricInputs, compute_metrics, metrics_from
    from cbsim.sim import simulate

    register_configs()
    with initialize_config_module(config_module="cbsim.conf", version_base="1.3"):
        cfg = load_config(compose("config", [*BASE, *overrides]))
    start_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kv_block = cfg.workload.kv_block_size * cfg.model.kv_bytes_per_token
    t0 = time.perf_counter()
    res = simulate(cfg, "async", want_trace=keep)
    m = compute_metrics(res.trace) if keep else metrics_from(MetricInputs(**res.tables))
    wall = time.perf_counter() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "kv_blocks": int(cfg.workload.kv_num_blocks or res.memory["kv_cache_bytes"] // kv_block),
        "requests": res.counters["requests"],
        "steps": m["steps"],
        "events": res.counters["trace_events"],
        "wall_s": wall,
        "peak_mb": peak_kib / 1024,
        "start_mb": start_kib / 1024,
        "p99_itl_ms": m["p99_itl_ms"],
    }


def measure(keep: bool, overrides: tuple[str, ...]) -> dict:
    """``one`` in a fresh interpreter."""
    cmd = [sys.executable, __file__, "--one", "keep" if keep else "fold"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([*cmd, *overrides], capture_output=True, text=True, env=env, cwd=REPO)
    if res.returncode:
        raise SystemExit(res.stderr[-3000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="rows " + ", ".join(map(str, QUICK)))
    ap.add_argument("--one", choices=("keep", "fold"), help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one == "keep", args.overrides)))
        return
    print(f"{' '.join(BASE)}; each row in its own interpreter")
    head = f"{'workload':<14}{'requests':>9}{'steps':>8}{'events':>9}{'trace':>7}{'wall s':>8}"
    print(head + f"{'peak MB':>9}{'over start MB':>15}{'same':>6}")
    rows = [r for i, r in enumerate(ROWS) if not args.quick or i in QUICK]
    untraced: dict[str, list[dict]] = {}
    for label, overrides in rows:
        ways = (False,) if label in UNTRACED_ONLY else (True, False)
        got = {keep: measure(keep, overrides) for keep in ways}
        same = "-"
        if len(got) == 2:
            p99 = (got[True]["p99_itl_ms"], got[False]["p99_itl_ms"])
            same = "yes" if math.isclose(*p99, rel_tol=1e-9) else "NO"
        untraced.setdefault(label, []).append(got[False])
        for keep, r in got.items():
            print(
                f"{label:<14}{r['requests']:>9}{r['steps']:>8}{r['events']:>9}"
                f"{'kept' if keep else 'none':>7}{r['wall_s']:>8.1f}{r['peak_mb']:>9.0f}"
                f"{r['peak_mb'] - r['start_mb']:>15.0f}{same:>6}"
            )
    growth(untraced)


def growth(untraced: dict[str, list[dict]]) -> None:
    """Peak growth per request between the "many requests" rows, per KV block from them to
    "long prompts" (the same requests, more blocks each)."""
    many = untraced.get("many requests", [])
    if len(many) >= 2:
        a, b = many[0], many[-1]
        per = (b["peak_mb"] - a["peak_mb"]) * 2**20 / (b["requests"] - a["requests"])
        print(f"many requests: {per:.0f} bytes a request ({a['requests']:,} to {b['requests']:,})")
    if many and "long prompts" in untraced:
        a, b = many[0], untraced["long prompts"][0]
        per = (b["peak_mb"] - a["peak_mb"]) * 2**20 / (b["kv_blocks"] - a["kv_blocks"])
        print(
            f"long prompts: {per:.1f} bytes a KV block ({a['kv_blocks']:,} to {b['kv_blocks']:,})"
        )


if __name__ == "__main__":
    main()
