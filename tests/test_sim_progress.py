"""A long simulation shows a progress bar, and a run with the bar is the same run."""

from __future__ import annotations

import dataclasses

import pytest
from sim_harness import make

import cbsim.sim.progress as progress
from cbsim.sim import simulate


def _with_progress(cfg, on: bool):
    return dataclasses.replace(cfg, output=dataclasses.replace(cfg.output, progress=on))


@pytest.mark.parametrize("engine", ["sync", "async"])
def test_the_bar_changes_nothing_in_the_run(engine, monkeypatch, capsys):
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr(progress, "EVENTS_PER_UPDATE", 64)
    cfg = make("tiny", batch_size=4, prompt_len=16, gen_len=300, num_requests=6)
    plain = simulate(_with_progress(cfg, False), engine, want_trace=True)
    assert "simulating" not in capsys.readouterr().err
    shown = simulate(_with_progress(cfg, True), engine, want_trace=True)
    err = capsys.readouterr().err
    assert f"simulating {engine}" in err and "1800/1800" in err
    assert shown.trace.events == plain.trace.events
    assert shown.counters == plain.counters
