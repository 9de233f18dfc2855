"""The 200-job what-if grid of issue 16 through the command line, as a user runs it.

    python benchmarks/bench_sweep.py                 # the grid with hydra/launcher=parallel
    python benchmarks/bench_sweep.py --launcher local --jobs 20

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

GRID = [
    "engine=sync,async",
    "workload.batch_size=1,2,4,8,16,32,64,128,192,256",
    "workload.prompt_len=256,1024",
    "workload.gen_len=256,512,1024,2048,4096",
]


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launcher", default="parallel")
    parser.add_argument("--n-jobs", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=0, help="only the first N batch sizes' jobs")
    args = parser.parse_args(argv)
    grid = list(GRID)
    if args.jobs:
        grid[1] = "workload.batch_size=1,2"
    with tempfile.TemporaryDirectory() as tmp:
        sweep = Path(tmp) / "sweep"
        cmd = [sys.executable, "-m", "cbsim", "-m", f"hydra/launcher={args.launcher}"]
        if args.launcher == "parallel":
            cmd.append(f"hydra.launcher.n_jobs={args.n_jobs}")
        cmd += [*grid, f"hydra.sweep.dir={sweep}"]
        load0 = os.getloadavg()
        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        r = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
        load1 = os.getloadavg()
        if r.returncode != 0:
            print(r.stderr[-3000:], file=sys.stderr)
            return r.returncode
        rows = sum(1 for _ in (sweep / "summary.csv").open()) - 1
        jobs = [d for d in sweep.iterdir() if d.is_dir() and d.name.isdigit()]
        largest = max(dir_bytes(d) for d in jobs)
        total = dir_bytes(sweep)
    print(f"machine: {os.cpu_count()} CPUs, {cpu_model()}, Python {platform.python_version()}")
    print(f"command: python -m cbsim -m hydra/launcher={args.launcher} ... ({len(jobs)} jobs)")
    print()
    # CPU s: every process of the sweep (main and workers); on a machine to itself, wall time
    # is about CPU s / cores
    print(
        "| jobs | wall s | CPU s | CPU s / cores | directory MB | largest job KB | summary rows "
        "| load before/after |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print(
        f"| {len(jobs)} | {wall:.1f} | {cpu:.1f} | {cpu / (os.cpu_count() or 1):.1f} | "
        f"{total / 1e6:.2f} | {largest / 1e3:.1f} | {rows} | {load0[0]:.1f} / {load1[0]:.1f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
