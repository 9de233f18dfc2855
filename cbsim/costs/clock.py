"""The SM clock under sustained GEMM load (``hardware.gpu.clock``): what a forward's GEMMs
lose when the board's power limit holds the clock below the boost clock the kernel tables were
timed at.

A forward's GEMM rate (its GEMMs' FLOPs over its time at boost, a share of ``peak_flops``) sets
the clock ratio a sustained load of it settles at (``settled_ratio``); its GEMMs' compute-bound
time (the FLOPs at the peak rate, at most the GEMMs' own time) stretches over the ratio, the
memory-bound rest does not. ``settle`` charges the settled clock (CostModel.forward, every step;
the same arithmetic elementwise on numpy arrays, for the fast-forward): decode steps are
milliseconds each, back to back, so they run there. ``lagged`` is the simulator's for a step
with prompt tokens, long against the clock's time constant: it starts from the clock the
forward before it left (recovered over any idle before it) and moves towards its own settled
ratio as it runs (the H200's kernel probes: GEMMs slowed within 50-150 ms of sustained
load).
"""

from __future__ import annotations

import math

import numpy as np

from cbsim.config.gpu_clock import GpuClock
from cbsim.costs.forward_cost import ForwardCost


def settled_ratio(clock: GpuClock, gemm_rate):
    """The clock ratio a sustained load of this GEMM rate (share of peak) settles at: 1 up to
    ``throttle_from``, falling linearly to ``min_ratio`` at ``throttle_full``; a number or a
    numpy array (the same float operations either way: the fast-forward checks the two agree)."""
    span = clock.throttle_full - clock.throttle_from
    if not isinstance(gemm_rate, (float, int, np.number)) and np.ndim(gemm_rate):
        depth = np.clip(
            (np.asarray(gemm_rate, dtype=np.float64) - clock.throttle_from) / span, 0, 1
        )
    else:  # a plain number: no numpy call per simulated step (np.ndim itself takes 1-2 us)
        depth = min(max((float(gemm_rate) - clock.throttle_from) / span, 0.0), 1.0)
    return 1.0 - (1.0 - clock.min_ratio) * depth


def settle(clock: GpuClock, flops: float, clocked_us: float, total_us, peak_per_us: float):
    """(clock ratio, extra microseconds) of forwards of ``total_us`` at boost (a number or a
    numpy array) whose GEMMs do ``flops`` with ``clocked_us`` of compute-bound time."""
    ratio = settled_ratio(clock, flops / (total_us * peak_per_us))
    return ratio, clocked_us * (1.0 / ratio - 1.0)


def settle_forward(
    cost: ForwardCost, clock: GpuClock, gemm_flops: float, head_flops: float, peak_per_us: float
) -> None:
    """``cost`` at its settled clock: the layers' GEMMs (``gemm_flops``) and the LM head's
    (``head_flops``) compute-bound time, each at most its own time, stretched."""
    cost.clocked_us = min(cost.linear_us, gemm_flops / peak_per_us) + min(
        cost.lm_head_us, head_flops / peak_per_us
    )
    if cost.clocked_us > 0.0:
        flops = gemm_flops + head_flops
        cost.clock_ratio, cost.throttle_us = settle(
            clock, flops, cost.clocked_us, cost.total_us, peak_per_us
        )


def lagged(
    clock: GpuClock, settled: float, clocked_us: float, at_boost_us: float, before: float, idle_us
) -> tuple[float, float]:
    """(extra microseconds, clock ratio after) of a forward of ``at_boost_us`` whose clock
    starts at ``before``, recovered towards 1 over ``idle_us`` of idle, and moves towards
    ``settled`` with time constant ``clock.tau_ms`` as it runs (the time-average ratio over the
    forward stretches its compute-bound time)."""
    tau = clock.tau_ms * 1e3
    if tau <= 0.0 or at_boost_us <= 0.0:
        return clocked_us * (1.0 / settled - 1.0), settled
    start = 1.0 - (1.0 - before) * math.exp(-max(idle_us, 0.0) / tau)
    decay = math.exp(-at_boost_us / tau)
    mean = settled + (start - settled) * (tau / at_boost_us) * (1.0 - decay)
    return clocked_us * (1.0 / mean - 1.0), settled + (start - settled) * decay
