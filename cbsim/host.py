"""The host's CPU model, read once for every record of a machine (profiles, recordings, the
runtime's trace metadata, benchmark tables), so they all name the CPU the same way."""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else what the platform reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The host's speed at the Python work of the host phases (schedule, prepare, update): a fixed
# batch of request-like records sorted, filtered and regrouped, timed SPEED_TRIALS times after
# one warm-up; the median counts. Recorded beside the CPU model so that two machines of one
# model name (a cloud's "Intel(R) Xeon(R) Processor") can still be told apart by speed.
SPEED_TRIALS = 7
SPEED_REQUESTS = 256
SPEED_ROUNDS = 20


def _scheduler_like_work() -> int:
    reqs = [
        {"id": i, "prompt": 64 + (i * 37) % 900, "done": (i * 13) % 97, "blocks": [i, i + 1]}
        for i in range(SPEED_REQUESTS)
    ]
    total = 0
    for r in range(SPEED_ROUNDS):
        running = sorted(reqs, key=lambda q: (q["prompt"] - q["done"], q["id"]))
        batch = [q for q in running if (q["id"] + r) % 3][:128]
        lengths = {q["id"]: q["prompt"] + q["done"] for q in batch}
        for q in batch:
            q["done"] += 1
            if q["done"] % 16 == 0:
                q["blocks"].append(len(q["blocks"]))
        total += sum(lengths.values()) + len(batch)
    return total


def median_us(work: Callable[[], object], trials: int = SPEED_TRIALS) -> float:
    """Microseconds ``work`` takes on this host: the median of ``trials`` after one warm-up."""
    work()
    times = []
    for _ in range(trials):
        t0 = time.perf_counter()
        work()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def python_speed_us() -> float:
    """Microseconds the fixed scheduler-like Python work takes on this host (a few ms in all).
    Lower is faster."""
    return round(median_us(_scheduler_like_work), 1)
