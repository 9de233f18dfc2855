"""How fast the simulator runs: CPU seconds, events per second and seconds per simulated step.

    python benchmarks/bench_sim.py                        # seed_repro, both engines (2 x 8192 steps)
    python benchmarks/bench_sim.py --experiment long_seq --repeat 5
    python benchmarks/bench_sim.py workload.gen_len=1024  # any Hydra override

CPU time is process time on one core (the simulator is single-threaded), best of --repeat runs,
of ``cbsim.sim.simulate`` three ways: without a trace (the metric tables only, what a sweep
needs), with the trace (events built, not written), and with the trace stepping every step
(``fast_forward=False``: no steady-state fast-forward). "metrics" is ``metrics_from`` on the
tables (cbsim.metrics, timed apart: it is not the simulator's). "events" counts SimPy events
plus trace events of the stepping run. Each way's metrics are checked equal to the stepping
run's trace metrics. The target (issue 16): seed_repro, both engines, no trace, <= 0.25 s.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import os
import platform
import time

from hydra import compose, initialize_config_module

from cbsim.config.store import load_config, register_configs
from cbsim.host import cpu_model
from cbsim.metrics import MetricInputs, compute_metrics, metrics_from
from cbsim.sim import simulate


def best_of(repeat: int, fn) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        gc.collect()
        t0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t0)
    return best, out


def machine() -> str:
    return f"{cpu_model()}, {os.cpu_count()} cores visible, Python {platform.python_version()}"


def same(a: dict, b: dict) -> bool:
    """Metrics equal, floats to 1e-9."""
    for k, v in a.items():
        w = b.get(k)
        if isinstance(v, dict):
            if not isinstance(w, dict) or not same(v, w) or set(v) != set(w):
                return False
        elif isinstance(v, float) and isinstance(w, float):
            if not (math.isnan(v) and math.isnan(w)) and not math.isclose(v, w, rel_tol=1e-9):
                return False
        elif v != w:
            return False
    return set(a) == set(b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default="seed_repro")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides")
    args = ap.parse_args()
    register_configs()
    with initialize_config_module(config_module="cbsim.conf", version_base="1.3"):
        cfg = load_config(compose("config", [f"+experiment={args.experiment}", *args.overrides]))
    as_dict = dataclasses.asdict(cfg)

    print(f"experiment={args.experiment} {' '.join(args.overrides)} (best of {args.repeat})")
    print(f"machine: {machine()}")
    head = f"{'engine':<7}{'steps':>7}{'no trace s':>11}{'metrics s':>10}{'trace s':>9}"
    print(head + f"{'stepping s':>11}{'events':>9}{'events/s':>11}{'us/step':>9}{'sim s':>9}  same")
    total = 0.0
    for engine in ("sync", "async"):
        fast, res = best_of(args.repeat, lambda e=engine: simulate(cfg, e, config_dict=as_dict))
        t_m, metrics = best_of(args.repeat, lambda r=res: metrics_from(MetricInputs(**r.tables)))
        traced, _ = best_of(args.repeat, lambda e=engine: simulate(cfg, e, want_trace=True))
        slow, full = best_of(
            1, lambda e=engine: simulate(cfg, e, want_trace=True, fast_forward=False)
        )
        full.trace.other_data["config"] = as_dict
        c = full.counters
        events = c["simpy_events"] + c["trace_events"]
        steps = c["steps"]
        ok = same(compute_metrics(full.trace), metrics)
        total += fast
        print(
            f"{engine:<7}{steps:>7}{fast:>11.3f}{t_m:>10.3f}{traced:>9.3f}{slow:>11.3f}"
            f"{events:>9}{events / fast:>11,.0f}{fast / steps * 1e6:>9.2f}"
            f"{c['total_us'] / 1e6:>9.2f}  {'yes' if ok else 'NO'}"
        )
    print(f"both engines, no trace: {total:.3f} s CPU (target <= 0.25 s for seed_repro)")


if __name__ == "__main__":
    main()
