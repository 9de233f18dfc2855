"""How big the HTML pages are and how fast headless Chromium draws them.

    python benchmarks/bench_pages.py            # every page, into a temporary directory
    python benchmarks/bench_pages.py --keep out # and keep the pages in out/

Pages: the seed-size run report (seed_repro, both engines simulated, 131k spans), the online
report, the run report of two recorded H200 traces (cbsim/recorded/h200/six_workloads/small_batch,
drawn from the traces alone), a 16-job sweep page (8 settings) and a capacity page (a small simulated
bisection). Each is written twice: with plotly.js inline (a page on its own) and referencing one
shared plotly.min.js beside it (a sweep or report directory; the sweep page always does). Load:
navigation until every plot is drawn (``window.cbsimReady``), in the tests' headless Chromium
(tests/browser.py: software rendering, no GPU), best of --repeat opens.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from cbsim.api import compose, load_traces, simulate
from cbsim.capacity import run_capacity_task
from cbsim.report import write_run_report
from cbsim.report.html import PLOTLY_FILE
from cbsim.sweep.report import write_sweep_report
from cbsim.sweep.summary import FINISHED, Job

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from browser import Browser, available  # noqa: E402

RECORDED = REPO / "cbsim" / "recorded" / "h200" / "six_workloads" / "small_batch"
CAPACITY = (
    "+experiment=capacity",
    "workload.num_requests=48",
    "extra.curve_points=4",
    "extra.tolerance=0.1",
)


def sweep_table() -> tuple[list[Job], pd.DataFrame]:
    """16 sync/async settings from simulations of a small decode workload (batch x length)."""
    rows, jobs = [], []
    for b in (1, 8, 32, 128):
        for g in (64, 256):
            r = simulate(
                "engine=compare",
                "model=llama3_1b",
                f"workload.batch_size={b}",
                f"workload.gen_len={g}",
                "workload.prompt_len=128",
            )
            s, a = r.metrics["sync"], r.metrics["async"]
            rows.append(
                {
                    "workload.batch_size": b,
                    "workload.gen_len": g,
                    "speedup": s["total_time_s"] / a["total_time_s"],
                    "gpu_idle_sync": s["gpu_idle_fraction"],
                    "gpu_idle_async": a["gpu_idle_fraction"],
                    "time_sync_s": s["total_time_s"],
                    "time_async_s": a["total_time_s"],
                }
            )
            for e in ("sync", "async"):
                ov = [f"engine={e}", f"workload.batch_size={b}", f"workload.gen_len={g}"]
                jobs.append(Job(len(jobs), ov, None, FINISHED, {"engine": e, **r.metrics[e]}))
    return jobs, pd.DataFrame(rows)


def build(out: Path) -> list[tuple[str, Path, bool]]:
    """(page, path, shares plotly.min.js) for every page, written into out/."""
    pages = []
    t0 = time.perf_counter()
    runs = {
        "seed_repro run report": simulate("+experiment=seed_repro", "engine=compare"),
        "online run report": simulate("+experiment=online"),
        "two recorded H200 traces": load_traces(
            RECORDED / "trace_sync.json.gz", RECORDED / "trace_async.json.gz"
        ),
    }
    print(f"simulated and read the runs in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    for i, (name, r) in enumerate(runs.items()):
        runs_by = {e: (t, m) for (e, t), m in zip(r.traces.items(), r.engine_metrics().values())}
        pages.append((name, write_run_report(runs_by, r.config, out / f"inline{i}.html"), False))
        shared = write_run_report(runs_by, r.config, out / "shared" / f"r{i}.html", out / "shared")
        pages.append((name, shared, True))
    jobs, comp = sweep_table()
    pages.append(
        ("sweep.html, 16 jobs", write_sweep_report(jobs, comp, out / "sw" / "sweep.html"), True)
    )
    cap = out / "cap"
    cap.mkdir()
    run_capacity_task(compose(*CAPACITY), cap)
    pages.append(("capacity.html", cap / "capacity.html", False))
    return pages


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="write the pages here and keep them")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if not available():
        sys.exit("needs headless Chromium (apt-get install chromium)")
    out = args.keep or Path(tempfile.mkdtemp(prefix="cbsim-pages-"))
    out.mkdir(parents=True, exist_ok=True)
    pages = build(out)
    print(
        f"machine: {platform.machine()}, {platform.processor() or 'cpu'}, "
        f"Python {platform.python_version()}; headless Chromium, software rendering"
    )
    print(
        f"{'page':<28}{'plotly.js':>11}{'page MB':>9}{'+ shared js MB':>16}"
        f"{'load s (best)':>15}{'plots s':>9}"
    )
    with Browser() as browser:
        for name, path, shared in pages:
            best, plots = float("inf"), 0.0
            for _ in range(args.repeat):
                r = browser.open(path)
                if r.problems:
                    sys.exit(f"{path}: {r.problems}")
                if r.load_s < best:
                    best, plots = r.load_s, (r.probe.get("render_ms") or 0) / 1e3
            js = path.parent / PLOTLY_FILE
            js_mb = js.stat().st_size / 1e6 if shared and js.is_file() else 0.0
            print(
                f"{name:<28}{'shared' if shared else 'inline':>11}"
                f"{path.stat().st_size / 1e6:>9.2f}{js_mb:>16.2f}{best:>15.2f}{plots:>9.2f}"
            )
    if args.keep:
        print(json.dumps({"pages": str(out)}))


if __name__ == "__main__":
    main()
