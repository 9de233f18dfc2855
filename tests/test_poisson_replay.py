"""An online (Poisson) run's batches depend on when the scheduler was asked: calibration replays
them on the recording's own clock, so their mixed steps are costed per request as the simulator
costs them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, compose_cfg
from omegaconf import OmegaConf

from cbsim.calibration.recordings import load
from cbsim.calibration.run_config import replay_batches
from cbsim.config.store import load_config
from cbsim.sim import run
from cbsim.trace import write_trace

RECORDINGS = REPO / "experiments" / "recordings"
# a recorded online run with many mixed steps, both engines
POISSON = sorted(RECORDINGS.glob("h200/fit_padded/1b_poisson_96/trace_*.json.gz"))
# a small online workload that queues, chunks and mixes prompts with decode rows
ONLINE = [
    "model=tiny",
    "workload.batch_size=8",
    "workload.num_requests=24",
    "workload.prompt_len=96",
    "workload.gen_len=12",
    "workload.arrival=poisson",
    "workload.rate=400",
    "workload.prompt_dist=lognormal",
    "workload.prompt_spread=0.5",
    "workload.max_batch_tokens=128",
]


def recorded(tmp_path: Path, engine: str):
    """A simulated online run, written with its config as a recording is."""
    cfg = compose_cfg([*ONLINE, f"engine={engine}"])
    trace = run(load_config(cfg), engine)
    trace.other_data["config"] = OmegaConf.to_container(cfg, resolve=True)
    return load([write_trace(trace, tmp_path / f"trace_{engine}.json.gz")])[0]


@pytest.mark.parametrize("engine", ["sync", "async"])
def test_a_simulated_online_run_replays_every_step(tmp_path, engine):
    rec = recorded(tmp_path, engine)
    fwd = rec.forward
    assert (fwd.kind == "mixed").any()  # the split matters: prompts beside decode rows
    assert set(rec.batches) == set(fwd.step)  # every step's totals match the replay
    # without the clock nothing is replayed: the batches depend on time
    assert replay_batches(rec.config, engine) is None
    # a prompt's chunks sum to its length: the split is per request, not the totals shared out
    starts = [rec.batches[s] for s in sorted(rec.batches)]
    assert any(len(np.unique(q)) > 1 for q, _ in starts)


def test_a_wrong_clock_stops_the_replay(tmp_path):
    rec = recorded(tmp_path, "sync")
    # asked later than the recording asked, the first mixed step admits other requests
    shifted = rec.spans.copy()
    host = (shifted.lane == "host") & (shifted.name == "schedule") & (shifted.step > 0)
    shifted.loc[host, "ts"] += 20_000.0
    rec.__dict__["spans"] = shifted
    assert 0 < len(rec.batches) < len(set(rec.forward.step))


@pytest.mark.parametrize("path", POISSON, ids=lambda p: "/".join(Path(p).parts[-2:]))
def test_recorded_poisson_runs_replay_every_step(path):
    rec = load([path], RECORDINGS)[0]
    assert set(rec.batches) == set(rec.forward.step)
