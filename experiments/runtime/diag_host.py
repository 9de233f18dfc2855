"""Where a step's host time goes: the pieces of `prepare` and `launch`, each timed alone.

    PYTHONUNBUFFERED=1 python3 experiments/runtime/diag_host.py [OVERRIDE ...]

Builds the runtime as `execute` does (default: the 8B shape, async, 32 x (256 + 64)), takes a
steady decode batch from the scheduler, and times, as medians over repeated calls: the whole
`plan` (prepare) and `launch`, and inside launch each call it makes (set_stream, event record,
wait_event, the H2D copy enqueue, the graph replay, the D2H copy enqueue). The GPU is drained
every few launches so the driver's queue never blocks the host.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import make_config  # noqa: E402

from cbsim.runtime.engine import build, check_device, plan_run  # noqa: E402
from cbsim.runtime.recorder import Recorder  # noqa: E402
from cbsim.runtime.streams import EventRing, launch  # noqa: E402

DEFAULT = ["mode=runtime", "engine=async", "model=llama3_8b", "workload.batch_size=32"]
DEFAULT += ["workload.prompt_len=256", "workload.gen_len=64"]
REPS = 200


def median_us(fn, reps: int = REPS, drain_every: int = 8) -> float:
    out = []
    for i in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
        if i % drain_every == drain_every - 1:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return float(np.median(out) * 1e6)


def main(argv: list[str]) -> None:
    config = make_config(DEFAULT + argv)
    engine = config.engine.name
    device = check_device(config, engine)
    setup = plan_run(config, engine, device, None)
    runner, streams = build(config, setup, device, False, None)
    sched = setup.scheduler
    batch, prev = None, None
    while batch is None or batch.kind != "decode":  # past the prefill, into steady decode
        prev, batch = batch, sched.schedule()
        if prev is not None:
            sched.update(prev, np.zeros(prev.num_samples, dtype=np.int64))
    slot = runner.slots[0]
    rec = Recorder(True, device, 16, len(setup.requests))
    rec.start(streams.compute, setup.requests)
    ring = EventRing(True)
    torch.cuda.set_stream(streams.compute)
    plan = runner.plan(batch, slot, None)
    ev = ring.get(0)
    s = streams
    rows = {
        "prepare (plan, incremental)": lambda: runner.plan(batch, slot, None),
        "prepare (plan, full)": lambda: (
            setattr(slot, "written", None),
            runner.plan(batch, slot, None),
        ),
        "launch (whole)": lambda: launch(runner, plan, s, ev, rec, 0),
        "set_stream x1": lambda: torch.cuda.set_stream(s.h2d),
        "event record x1": lambda: ev[0].record(s.compute),
        "wait_event x1": lambda: s.compute.wait_event(ev[1]),
        "copy_in (H2D enqueue)": lambda: runner.copy_in(plan),
        "compute (graph replay)": lambda: runner.compute(plan),
        "copy_out (D2H enqueue)": lambda: runner.copy_out(plan),
        "tokens (numpy view)": lambda: runner.tokens(plan),
    }
    print(f"host us per call (median of {REPS}), {torch.cuda.get_device_name()}, {DEFAULT + argv}")
    for name, fn in rows.items():
        us = median_us(fn)
        torch.cuda.set_stream(s.compute)
        print(f"  {name:<30}{us:>9.1f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
