"""The runtime's loop works between the host phases it times; calibration counts that time in the
phase before it, so the fitted phase costs hold all of the host's time per step."""

from __future__ import annotations

import numpy as np
import pandas as pd
from conftest import REPO, make_config

from cbsim.calibration.recordings import load
from cbsim.calibration.steps import LOOP_GAP_US, span_table, with_loop_work
from cbsim.sim import run

RECORDINGS = REPO / "experiments" / "recordings"
SYNC = RECORDINGS / "h200" / "fit_padded" / "1b_poisson_96" / "trace_sync.json.gz"


def host(names: list[str], starts: list[float], durs: list[float]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "lane": "host",
            "name": names,
            "ts": starts,
            "dur": durs,
            "end": np.add(starts, durs),
            "step": 0,
        }
    )


def test_short_gaps_go_to_the_phase_before_and_long_ones_or_sleeps_do_not():
    names = ["schedule", "prepare", "launch", "wait", "update", "schedule", "prepare"]
    # gaps after each span: 5, 0, 30, 0, 200 (a retirement's bookkeeping), 10 (an arrival)
    starts = [0.0, 15.0, 25.0, 85.0, 100.0, 320.0, 340.0]
    durs = [10.0, 10.0, 30.0, 15.0, 20.0, 10.0, 10.0]
    spans = host(names, starts, durs)
    gpu = pd.DataFrame({"lane": ["compute"], "name": ["forward"], "ts": [30.0], "dur": [50.0]})
    gpu["end"], gpu["step"] = 80.0, 0
    sp = pd.concat([spans, gpu], ignore_index=True)
    arrivals = pd.DataFrame({"name": ["arrival"], "ts": [335.0]})
    out = with_loop_work(sp, arrivals)
    h = out[out.lane == "host"]
    assert h.dur.tolist() == [15.0, 10.0, 60.0, 15.0, 20.0, 10.0, 10.0]
    assert (out[out.lane == "compute"].dur == 50.0).all()  # only the host's spans move
    assert (sp.dur == [*durs, 50.0]).all()  # the input is left as it was
    # nothing more than the threshold is ever added
    assert (h.dur - spans.dur).max() <= LOOP_GAP_US


def test_a_recorded_run_keeps_its_phases_apart_and_gains_the_loop_time():
    rec = load([SYNC], RECORDINGS)[0]
    raw, sp = rec.trace.spans, rec.spans
    raw_host = raw[raw.lane == "host"].sort_values("ts")
    fitted = sp[sp.lane == "host"].sort_values("ts")
    assert (fitted.end.to_numpy()[:-1] <= fitted.ts.to_numpy()[1:] + 1e-6).all()  # no overlap
    gained = float(fitted.dur.sum() - raw_host.dur.sum())
    steps = int(fitted.step.max()) + 1
    # the loop's own work after schedule, launch and update: 12-30 us a step in every run
    assert 10.0 * steps < gained < 40.0 * steps


def test_a_simulated_trace_is_left_as_it_is():
    # the simulator's phases follow each other; only runtime traces have loop work between them
    trace = run(make_config(["model=tiny", "workload.batch_size=2", "workload.gen_len=8"]), "sync")
    assert (span_table(trace).dur.to_numpy() == trace.spans.dur.to_numpy()).all()
