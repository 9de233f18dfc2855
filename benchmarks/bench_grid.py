"""Grid sweeps in one process per core: cbsim.sim.simulate_many over a what-if grid, no traces.

    python benchmarks/bench_grid.py                      # issue 16's 200-job grid, 2 workers
    python benchmarks/bench_grid.py --grid 10k --sample 400   # the 10^4-point grid, sampled

The 200-job grid is the issue's (engine=sync,async x batch 1..256 (10) x prompt 256,1024 x
gen 256..4096 (5)). The 10k grid: engine=sync,async x 25 batch sizes (1..256) x 4 prompt lengths
(128..2048) x 50 generation lengths (64..4096) = 10^4 jobs. ``--sample N`` times N jobs drawn at
random (seeded) and extrapolates to the whole grid (printed as such). Each job is simulated
without a trace and measured by cbsim.metrics (``metrics_from``), as a sweep's metrics.json
would hold it; nothing is written. Wall time on ``--workers`` processes (fork).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import logging
import multiprocessing as mp
import random
import time

from bench_sim import machine
from hydra import compose, initialize_config_module

from cbsim.config.store import load_config, register_configs
from cbsim.metrics import MetricInputs, metrics_from
from cbsim.sim import simulate_many

GRIDS = {
    "200": (
        [1, 2, 4, 8, 16, 32, 64, 128, 192, 256],
        [256, 1024],
        [256, 512, 1024, 2048, 4096],
    ),
    "10k": (
        [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192]
        + [208, 224, 256],
        [128, 512, 1024, 2048],
        [64 + round(i * (4096 - 64) / 49) for i in range(50)],
    ),
}


def jobs(grid: str) -> list[tuple[str, int, int, int]]:
    batches, prompts, gens = GRIDS[grid]
    return list(itertools.product(["sync", "async"], batches, prompts, gens))


def run_chunk(chunk: list[tuple[str, int, int, int]]) -> tuple[int, float]:
    """Simulate and measure the chunk's jobs; (jobs, CPU seconds)."""
    logging.disable(logging.WARNING)  # configs past the device's memory say so once each
    register_configs()
    with initialize_config_module(config_module="cbsim.conf", version_base="1.3"):
        base = load_config(compose("config", []))
    t0 = time.process_time()
    configs = []
    for engine, batch, prompt, gen in chunk:
        w = dataclasses.replace(base.workload, batch_size=batch, prompt_len=prompt, gen_len=gen)
        e = dataclasses.replace(base.engine, name=engine)
        configs.append(dataclasses.replace(base, workload=w, engine=e))
    out = simulate_many(configs, lambda tables: metrics_from(MetricInputs(**tables)))
    assert all(o[e]["steps"] > 0 for o, (e, *_) in zip(out, chunk))
    return len(out), time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", choices=sorted(GRIDS), default="200")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--sample", type=int, default=0, help="time this many jobs, extrapolate")
    args = ap.parse_args()
    todo = jobs(args.grid)
    total = len(todo)
    if args.sample and args.sample < total:
        todo = random.Random(0).sample(todo, args.sample)
    random.Random(1).shuffle(todo)  # long and short jobs mixed across workers
    chunks = [todo[i :: args.workers] for i in range(args.workers)]
    t0 = time.perf_counter()
    with mp.get_context("fork").Pool(args.workers) as pool:
        done = pool.map(run_chunk, chunks)
    wall = time.perf_counter() - t0
    n, cpu = sum(d[0] for d in done), sum(d[1] for d in done)
    print(f"machine: {machine()}")
    print(
        f"{'grid':<6}{'jobs':>7}{'workers':>8}{'wall s':>9}{'CPU s':>9}{'ms/job':>8}{'jobs/s':>8}"
    )
    print(
        f"{args.grid:<6}{n:>7}{args.workers:>8}{wall:>9.1f}{cpu:>9.1f}"
        f"{cpu / n * 1e3:>8.1f}{n / wall:>8.1f}"
    )
    if n < total:
        # the CPU time scales with the jobs; the wall time also with whoever else uses the cores
        print(
            f"extrapolated to all {total} jobs (from a seeded sample of {n}): "
            f"{cpu * total / n:.0f} s CPU, {cpu * total / n / args.workers:.0f} s wall on "
            f"{args.workers} idle cores ({wall * total / n:.0f} s at this run's load)"
        )


if __name__ == "__main__":
    main()
