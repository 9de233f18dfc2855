"""How fast the simulator runs: CPU seconds, events per second and seconds per simulated step.

    python benchmarks/bench_sim.py                        # seed_repro, both engines (2 x 8192 steps)
    python benchmarks/bench_sim.py --experiment long_seq --repeat 5
    python benchmarks/bench_sim.py workload.gen_len=1024  # any Hydra override

CPU time is process time on one core (the simulator is single-threaded), best of --repeat runs of
``cbsim.sim.run`` (trace building included; metrics and file writing not). "events" counts SimPy
events plus trace events written. The scheduler's share is timed separately by driving the shared
scheduler alone in the same order (cbsim.scheduler.run_to_completion). The target (issue 3):
seed_repro, both engines, in at most 1 s of CPU.
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np
from hydra import compose, initialize_config_module

from cbsim.config.store import load_config, register_configs
from cbsim.scheduler import Scheduler, default_num_kv_blocks, run_to_completion
from cbsim.sim import run
from cbsim.workload import make_requests


def best_of(repeat: int, fn) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        gc.collect()
        t0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t0)
    return best, out


def scheduler_only(cfg, overlap: bool) -> int:
    w = cfg.workload
    reqs = make_requests(w, cfg.model.vocab_size)
    sched = Scheduler(w, default_num_kv_blocks(w, reqs))
    sched.add_all(reqs)
    tokens = np.ones(max(w.batch_size, 1), dtype=np.int64)
    return run_to_completion(sched, lambda b: tokens[: b.num_samples], overlap=overlap)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default="seed_repro")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides")
    args = ap.parse_args()
    register_configs()
    with initialize_config_module(config_module="cbsim.conf", version_base="1.3"):
        cfg = load_config(compose("config", [f"+experiment={args.experiment}", *args.overrides]))

    print(f"experiment={args.experiment} {' '.join(args.overrides)} (best of {args.repeat})")
    print(
        f"{'engine':<8}{'steps':>8}{'CPU s':>9}{'sched s':>9}{'events':>10}{'events/s':>12}"
        f"{'us/step':>10}{'sim s':>10}"
    )
    total_cpu = 0.0
    for engine in ("sync", "async"):
        cpu, trace = best_of(args.repeat, lambda e=engine: run(cfg, e))
        sched_cpu, _ = best_of(args.repeat, lambda e=engine: scheduler_only(cfg, e == "async"))
        c = trace.other_data["sim_counters"]
        events = c["simpy_events"] + c["trace_events"]
        steps = c["steps"]
        total_cpu += cpu
        print(
            f"{engine:<8}{steps:>8}{cpu:>9.3f}{sched_cpu:>9.3f}{events:>10}"
            f"{events / cpu:>12,.0f}{cpu / steps * 1e6:>10.1f}{c['total_us'] / 1e6:>10.2f}"
        )
    print(f"both engines: {total_cpu:.3f} s CPU (target <= 1 s for seed_repro)")


if __name__ == "__main__":
    main()
