"""The what-if grids of issue 16 through the command line, as a user runs them.

    python benchmarks/bench_sweep.py                     # 200 jobs, hydra/launcher=parallel
    python benchmarks/bench_sweep.py --launcher local    # 200 jobs in one process
    python benchmarks/bench_sweep.py --grid 10k --every 5   # python -m cbsim.sweep.grid, 1/5
        # of the 10^4-point grid (every 5th generation length), extrapolated to all of it

Prints one table: wall time, jobs per second, the sweep directory's size, the largest job
directory, summary.csv's rows, and the machine (CPUs, model, load average before and after: the
machines here are shared, and a loaded machine's wall time says more about its neighbours).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cbsim.host import cpu_model

GRID = [
    "engine=sync,async",
    "workload.batch_size=1,2,4,8,16,32,64,128,192,256",
    "workload.prompt_len=256,1024",
    "workload.gen_len=256,512,1024,2048,4096",
]
# 2 x 25 x 4 x 50 = 10^4 points (the grid of benchmarks/bench_grid.py)
BATCHES_10K = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160]
BATCHES_10K += [192, 208, 224, 256]
GENS_10K = [64 + round(i * (4096 - 64) / 49) for i in range(50)]


def grid_10k(every: int) -> list[str]:
    return [
        "engine=sync,async",
        "workload.batch_size=" + ",".join(map(str, BATCHES_10K)),
        "workload.prompt_len=128,512,1024,2048",
        "workload.gen_len=" + ",".join(map(str, GENS_10K[::every])),
    ]


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run(cmd: list[str], cwd: str) -> tuple[float, float, tuple, tuple]:
    """Wall and CPU seconds (every process of the command), load average before and after."""
    load0 = os.getloadavg()
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return wall, cpu, load0, os.getloadavg()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", choices=("200", "10k"), default="200")
    parser.add_argument("--launcher", default="parallel", help="the 200-job grid's launcher")
    parser.add_argument("--n-jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--every", type=int, default=1, help="10k: every Nth generation length")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sweep"
        if args.grid == "200":
            cmd = [sys.executable, "-m", "cbsim", "-m", f"hydra/launcher={args.launcher}"]
            if args.launcher == "parallel":
                cmd.append(f"hydra.launcher.n_jobs={args.n_jobs}")
            cmd += [*GRID, f"hydra.sweep.dir={out}"]
            route = f"python -m cbsim -m hydra/launcher={args.launcher}"
        else:
            cmd = [sys.executable, "-m", "cbsim.sweep.grid", str(out), *grid_10k(args.every)]
            cmd += ["--jobs", str(args.n_jobs)]
            route = f"python -m cbsim.sweep.grid --jobs {args.n_jobs}"
        wall, cpu, load0, load1 = run(cmd, tmp)
        rows = sum(1 for _ in (out / "summary.csv").open()) - 1
        jobs = [d for d in out.iterdir() if d.is_dir() and d.name.isdigit()]
        largest = max((dir_bytes(d) for d in jobs), default=0)
        total = dir_bytes(out)
    print(f"machine: {os.cpu_count()} CPUs, {cpu_model()}, Python {platform.python_version()}")
    print(f"command: {route} ... ({rows} jobs)")
    print()
    # CPU s: every process (main and workers); on a machine to itself, wall is about CPU / cores
    print(
        "| jobs | wall s | CPU s | CPU s / cores | directory MB | largest job KB | summary rows "
        "| load before/after |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print(
        f"| {rows} | {wall:.1f} | {cpu:.1f} | {cpu / (os.cpu_count() or 1):.1f} | "
        f"{total / 1e6:.2f} | {largest / 1e3:.1f} | {rows} | {load0[0]:.1f} / {load1[0]:.1f} |"
    )
    if args.grid == "10k" and args.every > 1:
        scale = 10_000 / rows
        print(
            f"extrapolated to 10^4 points: {wall * scale:.0f} s wall, {cpu * scale:.0f} s CPU "
            f"({cpu * scale / (os.cpu_count() or 1):.0f} s on {os.cpu_count()} idle cores)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
