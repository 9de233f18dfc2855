"""Microseconds per schedule() + update() step of the continuous-batching scheduler.

    python benchmarks/bench_scheduler.py [--steps N]

Cases: steady decode at batch 32 and 128 (256-token prompts, long generations; the async order,
as the simulator drives it, plus carry_over_index per step), and an online mixed workload
(Poisson arrivals, varied lengths, chunked prefill, a KV cache small enough to preempt).
A benchmark, never a timed test.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from cbsim.config.schema import WorkloadConfig
from cbsim.scheduler import Scheduler, carry_over_index, default_num_kv_blocks
from cbsim.workload import make_requests


def drive(sched: Scheduler, overlap: bool, carry: bool, max_steps: int) -> tuple[int, float]:
    """Offline async/sync loop with constant tokens; returns (steps, seconds)."""
    prev = None
    steps = 0
    t0 = time.perf_counter()
    while sched.has_unfinished() and steps < max_steps:
        batch = sched.schedule()
        if batch is not None:
            steps += 1
        if overlap:
            if prev is not None:
                if carry and batch is not None:
                    carry_over_index(prev, batch)
                sched.update(prev, np.ones(prev.num_samples, dtype=np.int64))
            prev = batch
        elif batch is not None:
            sched.update(batch, np.ones(batch.num_samples, dtype=np.int64))
    return steps, time.perf_counter() - t0


def online(steps_cap: int) -> tuple[int, float]:
    w = WorkloadConfig(
        batch_size=64,
        num_requests=2000,
        prompt_len=512,
        prompt_dist="lognormal",
        prompt_spread=0.8,
        gen_len=256,
        gen_dist="lognormal",
        gen_spread=0.8,
        arrival="poisson",
        rate=400.0,
        max_batch_tokens=2048,
        kv_block_size=16,
        kv_num_blocks=2000,
    )
    reqs = make_requests(w, 32000)
    sched = Scheduler(w)
    sched.add_all(reqs)
    now, prev, steps = 0.0, None, 0
    t0 = time.perf_counter()
    while sched.has_unfinished() and steps < steps_cap:
        batch = sched.schedule(now)
        if batch is not None:
            steps += 1
            now += 0.005 + 1e-6 * batch.query_tokens  # a made-up forward time
        if prev is not None:
            if batch is not None:
                carry_over_index(prev, batch)
            sched.update(prev, np.ones(prev.num_samples, dtype=np.int64))
        elif batch is None:
            now = max(now, sched.next_arrival_s())
        prev = batch
    return steps, time.perf_counter() - t0


def best_of(repeats: int, run) -> tuple[int, float, float]:
    """Best wall and CPU microseconds per step over a few repeats (the machine may be shared)."""
    walls, cpus = [], []
    for _ in range(repeats):
        c0 = time.process_time()
        steps, sec = run()
        cpus.append((time.process_time() - c0) / steps)
        walls.append(sec / steps)
    return steps, 1e6 * min(walls), 1e6 * min(cpus)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"microseconds per schedule + update step (best of {args.repeats}; wall, CPU)")
    for bs in (32, 128):
        w = WorkloadConfig(batch_size=bs, prompt_len=256, gen_len=args.steps)
        reqs = make_requests(w, 128256)
        for overlap, carry in ((False, False), (True, True)):

            def run(overlap=overlap, carry=carry, w=w, reqs=reqs):
                sched = Scheduler(w, default_num_kv_blocks(w, reqs))
                sched.add_all(reqs)
                return drive(sched, overlap, carry, args.steps)

            steps, wall, cpu = best_of(args.repeats, run)
            order = "async+carry_over" if overlap else "sync"
            print(f"decode bs={bs:<4d} {order:17s} {steps:6d} steps {wall:8.2f} {cpu:8.2f}")
    steps, wall, cpu = best_of(args.repeats, lambda: online(args.steps))
    print(f"online mixed (see online())     {steps:6d} steps {wall:8.2f} {cpu:8.2f}")


if __name__ == "__main__":
    main()
