"""Why the host's speed changes between runs and within one: the CPU, its neighbours, pinning.

    PYTHONUNBUFFERED=1 python3 experiments/runtime/diag_host_speed.py OUTDIR [--runtime]

1. The machine: CPUs, SMT siblings, steal time (/proc/stat) over the whole diagnosis.
2. A fixed piece of Python (the shared scheduler's decode step, as bench_scheduler times it)
   timed in 20 ms windows for 6 s unpinned, with the CPU it ran on: does its speed switch
   between levels, and does a switch follow a migration?
3. The same pinned to each CPU in turn (two passes): is a CPU slow, or a time?
4. --runtime: a sync run of the 1B shape through `cbsim.runtime.run` (what `python -m cbsim
   mode=runtime` calls), unpinned and pinned to one CPU, alternating, twice each: the host
   phases per 100-step window and the main thread's CPU sampled every 10 ms.
Everything to OUTDIR/host_speed.json; a summary on stdout.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def cpu_of(tid: int | None = None) -> int:
    path = f"/proc/self/task/{tid}/stat" if tid else "/proc/self/stat"
    with open(path) as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def steal() -> dict[str, int]:
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu"):
                parts = line.split()
                out[parts[0]] = int(parts[8])  # steal, in USER_HZ ticks
    return out


def machine() -> dict:
    cpus = sorted(os.sched_getaffinity(0))
    sib = {}
    for c in cpus:
        p = Path(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list")
        sib[c] = p.read_text().strip() if p.exists() else "?"
    return {"cpus": cpus, "siblings": sib, "loadavg": Path("/proc/loadavg").read_text().strip()}


def make_step():
    """One sync decode step of the shared scheduler at batch 32 (bench_scheduler's loop body)."""
    from cbsim.config.schema import WorkloadConfig
    from cbsim.scheduler import Scheduler
    from cbsim.workload import make_requests

    w = WorkloadConfig(batch_size=32, prompt_len=256, gen_len=4096, kv_num_blocks=1 << 14)
    state = {}

    def step() -> None:
        b = state["s"].schedule() if "s" in state else None
        if b is None:  # the workload is done: a fresh one
            state["s"] = Scheduler(w)
            state["s"].add_all(make_requests(w, 32000))
            b = state["s"].schedule()
        state["s"].update(b, np.ones(b.num_samples, dtype=np.int64))

    return step


def windows(fn, seconds: float, window_s: float = 0.02) -> list[tuple[float, float, int]]:
    """(start s, median us per call, cpu) per window."""
    out, t_end = [], time.perf_counter() + seconds
    while (t0 := time.perf_counter()) < t_end:
        times = []
        while (t := time.perf_counter()) - t0 < window_s:
            fn()
            times.append(time.perf_counter() - t)
        out.append((t0, float(np.median(times)) * 1e6, cpu_of()))
    return out


def describe(ws: list[tuple[float, float, int]]) -> dict:
    us = np.array([w[1] for w in ws])
    cpus = [w[2] for w in ws]
    fast = np.percentile(us, 10)
    return {
        "windows": len(ws),
        "us_p10_p50_p90": [round(float(np.percentile(us, q)), 2) for q in (10, 50, 90)],
        "slow_share": round(float(np.mean(us > 1.5 * fast)), 3),
        "migrations": int(sum(a != b for a, b in zip(cpus, cpus[1:], strict=False))),
        "cpus": sorted(set(cpus)),
        "us_by_cpu": {
            c: round(float(np.median([w[1] for w in ws if w[2] == c])), 2) for c in set(cpus)
        },
    }


class CpuSampler(threading.Thread):
    """The main thread's CPU every 10 ms (a sleeping thread: a few us of work per sample)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.tid, self.samples, self.stop = threading.main_thread().native_id, [], False

    def run(self) -> None:
        while not self.stop:
            self.samples.append((time.perf_counter(), cpu_of(self.tid)))
            time.sleep(0.01)


def runtime_runs(pin_cpu: int) -> list[dict]:
    from cases import shape
    from record import make_config

    from cbsim.runtime import run

    overrides = ["mode=runtime", "engine=sync", *shape("llama3_1b", 1, 128, 1024)]
    results, all_cpus = [], set(os.sched_getaffinity(0))
    for i, pinned in enumerate([False, True, False, True]):
        os.sched_setaffinity(0, {pin_cpu} if pinned else all_cpus)
        sampler = CpuSampler()
        sampler.start()
        trace = run(make_config(overrides), "sync")
        sampler.stop = True
        s = trace.spans
        host = s[s.lane == "host"]
        per = {}
        for phase in ("prepare", "update", "launch", "schedule"):
            d = host[host.name == phase].sort_values("ts").dur.to_numpy()
            per[phase] = [round(float(np.median(c)), 1) for c in np.array_split(d, 10)]
        cpus = [c for _, c in sampler.samples]
        f = s[s.lane == "compute"].sort_values("ts")
        gaps = f.ts.to_numpy()[1:] - f.end.to_numpy()[:-1]
        results.append(
            {
                "run": i,
                "pinned": pinned,
                "phase_us_per_tenth": per,
                "gap_us_p50": round(float(np.median(gaps)), 1),
                "gap_us_per_tenth": [
                    round(float(np.median(c)), 1) for c in np.array_split(gaps, 10)
                ],
                "cpus_seen": sorted(set(cpus)),
                "migrations": int(sum(a != b for a, b in zip(cpus, cpus[1:], strict=False))),
            }
        )
        print(json.dumps(results[-1]), flush=True)
    os.sched_setaffinity(0, all_cpus)
    return results


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"machine": machine(), "steal_start": steal()}
    print(json.dumps(report["machine"]), flush=True)
    step = make_step()
    report["unpinned"] = describe(windows(step, 6.0))
    print("unpinned", json.dumps(report["unpinned"]), flush=True)
    pinned = {}
    for _ in range(2):
        for c in report["machine"]["cpus"]:
            os.sched_setaffinity(0, {c})
            pinned.setdefault(c, []).append(describe(windows(step, 0.25))["us_p10_p50_p90"])
    os.sched_setaffinity(0, set(report["machine"]["cpus"]))
    report["pinned"] = pinned
    print("pinned p10/p50/p90 per cpu, two passes:", json.dumps(pinned), flush=True)
    report["steal_after_bench"] = steal()
    if "--runtime" in argv:
        best = min(pinned, key=lambda c: min(x[1] for x in pinned[c]))
        report["runtime_pin_cpu"] = best
        report["runtime"] = runtime_runs(best)
    report["steal_end"] = steal()
    st = {k: report["steal_end"][k] - report["steal_start"][k] for k in report["steal_end"]}
    report["steal_ticks"] = st
    print("steal ticks over the diagnosis:", st, flush=True)
    (out / "host_speed.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
