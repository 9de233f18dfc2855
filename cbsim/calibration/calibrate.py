"""Fit the simulator's cost model (cbsim.costs) to recorded traces.

Every fitted number is a HardwareConfig field, and every prediction goes through the simulator's
own ``CostModel``, so plugging the profile back in reproduces what was fitted:

- forward pass (compute-lane ``forward`` / ``graph_replay`` spans, forward.py): ``CostModel.forward`` is a sum
  of rooflines (linear layers, LM head, attention) plus ``forward_fixed_us`` and a gap per kernel;
  its efficiencies, the fixed cost, the carry-over and the kernel gaps are fitted by bounded
  Gauss-Newton on relative residuals (decode and prefill steps), each forward with the idle
  time of the compute stream before it (``CostModel.idle_slowdown_us``);
- copies: ``copy_latency_us + bytes / bandwidth`` (h2d and d2h share the latency);
- host phases: ``fixed + per_request x requests + per_token x tokens`` (tokens: query tokens for
  schedule and prepare, sampled tokens for update, as the simulator charges them);
- launch: one ``graph_launch_us`` (or ``kernel_launch_us`` per kernel) plus the copy and event
  enqueues; wait: ``sync_wake_us`` after the awaited D2H ends, ``event_us`` when nothing is
  pending; carry-over: its span;
- host regimes (regimes.py): the host's two speed levels over time, from windows of steps whose
  phases run slower than the phase model says; the host costs above are fitted at the fast level;
- host spread (spread.py): the step-to-step spread of the host's speed inside a level within a
  run, and between device calls of the same workload (kept when no workload has two calls);
- the uneven share (uneven.py, with ``FitOptions.uneven``): how far a one-wave decode launch
  moves toward its longest request, measured over the async runs with the fitted forward;
- the loop's cold start (loop_start.py): the recorded head of each run (its time zero to its
  first GPU span) over the simulated one;
- the host's reading (``host.level.python_us``): the median of the traces' start-of-run
  readings, the host the fitted costs hold on.

A term the traces cannot tell apart from others (collinear, or too small to see) keeps the base
profile's value and the table says "kept".
"""

from __future__ import annotations

import dataclasses
import statistics

from cbsim.calibration.forward import fit_forward
from cbsim.calibration.host import fit_copies, fit_wait_launch
from cbsim.calibration.imported import fit_import_host, fit_import_kernels
from cbsim.calibration.loop_start import fit_loop_start
from cbsim.calibration.options import FitOptions
from cbsim.calibration.progress import progress
from cbsim.calibration.recordings import Recorded, label
from cbsim.calibration.regimes import HostLevels, fit_host_levels
from cbsim.calibration.result import Calibration, Row
from cbsim.calibration.spread import fit_spread
from cbsim.calibration.uneven import fit_uneven_share
from cbsim.config.hardware import HostLevel
from cbsim.config.schema import HardwareConfig

__all__ = ["Calibration", "FitOptions", "Row", "calibrate"]


def calibrate(
    recs: list[Recorded],
    base: HardwareConfig,
    name: str | None = None,
    options: FitOptions | None = None,
) -> Calibration:
    """Fit every term the traces determine, starting from (and falling back to) ``base``."""
    hw = dataclasses.replace(
        base, host=dataclasses.replace(base.host), gpu=dataclasses.replace(base.gpu)
    )
    hw.tier = "fitted"
    if name:
        hw.name = name
    cal = Calibration(hw, traces=[label(r.path, r.root) for r in recs])
    recorded_host_level(recs, cal, base.name)
    # a profiler import (its run config the command line's): its kernel counts and gaps first,
    # which the forward fit keeps; its host waits are not the runtime's (not fitted)
    imports = [r for r in recs if r.imported]
    options = options or FitOptions()
    # each step's host-speed level, found with the host phases (fitted at the fast level)
    levels = HostLevels()
    stages = [
        ("kernels", lambda: fit_import_kernels(imports, cal)),
        ("forward", lambda: fit_forward(recs, cal, options)),
        ("uneven share", lambda: options.uneven and fit_uneven_share(recs, cal)),
        ("copies", lambda: fit_copies(recs, cal)),
        ("host phases", lambda: fit_host_levels(recs, cal, levels)),
        (
            "wait and launch",
            lambda: fit_wait_launch([r for r in recs if not r.imported], cal, levels.at),
        ),
        ("host spread", lambda: fit_spread(recs, cal, levels.at)),
        ("import host", lambda: fit_import_host(imports, cal)),
        # last: it simulates each run with every other term as fitted
        ("loop start", lambda: fit_loop_start(recs, cal)),
    ]
    for _, fit in progress(stages, len(stages), "calibrating", options.progress):
        fit()
    return cal


def recorded_host_level(recs: list[Recorded], cal: Calibration, base_name: str) -> None:
    """``host.level``: the host the costs are fitted on, by the median of the runs' readings at
    start (python_us 0 when a run has none: then the host is not known by it), and no other
    host predicted for, so every fit simulates the runs' own host."""
    runs = [r for r in recs if not r.imported]
    readings = [r.host_python_us for r in runs]
    known = [x for x in readings if x is not None]
    value = round(statistics.median(known), 1) if known and len(known) == len(readings) else 0.0
    before = cal.hardware.host.level.python_us
    cal.hardware.host.level = HostLevel(python_us=value)
    if value:
        cal.provenance["host.level.python_us"] = (
            f"measured: the median start-of-run host_python_us of {len(runs)} trace(s)"
        )
    elif before:
        cal.provenance["host.level.python_us"] = (
            f"from hardware={base_name}: not carried (0), as the traces carry no host reading"
        )
