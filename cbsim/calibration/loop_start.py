"""The loop's cold start (``hardware.host.loop_start_us``): how much later than its steady
phases say the first step reaches the GPU.

A recorded run's compute stream starts 1-7 ms after the trace's time zero (the H200's recordings): the
runtime records its trace anchor (a synchronize and an event) and the first step's schedule,
prepare and input copy run cold, several times their steady cost. The simulator without the
term starts it about 0.5 ms in. In a GPU-bound async run that head is most of the recorded
GPU idle, so a band of idle without it sits below the recorded value. Fitted as the median,
over the runs, of the recorded head less the simulated one (each run simulated with the
profile fitted so far and no cold start), at the host's expected speed factor (the simulator
charges the term times the factor in force at time zero).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cbsim.calibration.recordings import Recorded
from cbsim.calibration.result import Calibration, set_quantile
from cbsim.calibration.simulated import simulate_like
from cbsim.calibration.steps import gpu_lane
from cbsim.trace import Trace


def head_us(trace: Trace) -> float:
    """From the trace's first event to the first span on the compute stream."""
    sp, inst = trace.spans, trace.instants
    start = float(sp.ts.min())
    if not inst.empty:
        start = min(start, float(inst.ts.min()))
    return float(sp[sp.lane == gpu_lane(sp)].ts.min()) - start


def fit_loop_start(recs: list[Recorded], cal: Calibration) -> None:
    """``loop_start_us`` from the recorded runs (a profiler import's trace starts elsewhere)."""
    runs = [r for r in recs if not r.imported]
    if not runs:
        return
    hw = cal.hardware
    cold = dataclasses.replace(hw, host=dataclasses.replace(hw.host, loop_start_us=0.0))
    excess = np.array([head_us(r.trace) - head_us(simulate_like(r, cold)) for r in runs])
    factor = hw.host.regimes.expected_factor
    set_quantile(cal, "loop start (head)", excess, hw.host, "loop_start_us", per=factor)
