"""The SM clock under sustained GEMM load (``hardware.gpu.clock``): what a decode step's GEMMs
lose when the board's power limit holds the clock below the boost clock the kernel tables were
timed at.

A decode step's GEMM rate (its GEMMs' FLOPs over its time at boost, a share of ``peak_flops``)
sets the clock ratio its load settles at (``settled_ratio``): decode steps run back to back,
milliseconds each, so they run there. Their GEMMs' compute-bound time (the FLOPs at the peak
rate, at most the GEMMs' own time) stretches over the ratio; the memory-bound rest does not.
Steps with prompt tokens stay at the tables' clock: what the recordings show of them does not
follow one rate (docs/validation.md). The same arithmetic works elementwise on numpy arrays, for
the fast-forward.
"""

from __future__ import annotations

import numpy as np

from cbsim.config.gpu_clock import GpuClock


def settled_ratio(clock: GpuClock, gemm_rate):
    """The clock ratio a sustained load of this GEMM rate (share of peak) settles at: 1 up to
    ``throttle_from``, falling linearly to ``min_ratio`` at ``throttle_full``; a number or a
    numpy array."""
    span = clock.throttle_full - clock.throttle_from
    depth = np.clip((np.asarray(gemm_rate, dtype=np.float64) - clock.throttle_from) / span, 0, 1)
    ratio = 1.0 - (1.0 - clock.min_ratio) * depth
    return float(ratio) if np.ndim(ratio) == 0 else ratio


def settle(clock: GpuClock, flops: float, clocked_us: float, total_us, peak_per_us: float):
    """(clock ratio, extra microseconds) of forwards of ``total_us`` at boost (a number or a
    numpy array) whose GEMMs do ``flops`` with ``clocked_us`` of compute-bound time."""
    ratio = settled_ratio(clock, flops / (total_us * peak_per_us))
    return ratio, clocked_us * (1.0 / ratio - 1.0)
