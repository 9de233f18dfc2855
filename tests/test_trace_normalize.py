"""Normalising recorded runtime traces (clock drift, graph starts): applied once, on read."""

from __future__ import annotations

import pytest

from cbsim.trace import TraceBuilder, read_trace, write_trace
from cbsim.trace import schema as S
from cbsim.trace.normalize import (
    POST_GRAPH_HOST_US,
    correct_drift,
    correct_graph_start,
    normalize,
)


def drifted():
    b = TraceBuilder("runtime", {"clock_drift_us": 100.0})
    b.span(S.HOST, S.WAIT, 0.0, 1000.0, step=0)
    b.span(S.COMPUTE, S.FORWARD, 0.0, 500.0, step=0)
    b.span(S.D2H, S.COPY_D2H, 500.0, 500.0, step=0)
    return b.build()


def test_clock_drift_is_spread_over_the_run():
    fixed = correct_drift(drifted())
    sp = fixed.spans.set_index("name")
    assert sp.loc[S.WAIT, "ts"] == 0.0 and sp.loc[S.WAIT, "dur"] == 1000.0  # host: as recorded
    assert sp.loc[S.FORWARD, "end"] == pytest.approx(550.0)  # half-way: half the drift
    assert sp.loc[S.COPY_D2H, "end"] == pytest.approx(1100.0)
    assert fixed.other_data["clock_drift_corrected"]


def graph_trace(source: str = "runtime", other=None):
    b = TraceBuilder(source, other or {})
    # step 0: a sync launch that goes on 600 us past the compute marker; step 1: async (the
    # launch ends long before the replay starts); step 2: eager, never moved
    b.span(S.HOST, S.LAUNCH, 0.0, 700.0, step=0)
    b.span(S.COMPUTE, S.GRAPH_REPLAY, 100.0, 9000.0, step=0)
    b.span(S.HOST, S.LAUNCH, 1000.0, 300.0, step=1)
    b.span(S.COMPUTE, S.GRAPH_REPLAY, 9100.0, 8000.0, step=1)
    b.span(S.HOST, S.LAUNCH, 17200.0, 900.0, step=2)
    b.span(S.COMPUTE, S.FORWARD, 17300.0, 2000.0, step=2)
    return b.build()


def test_graph_span_starts_when_the_launch_has_submitted_it():
    fixed = correct_graph_start(graph_trace())
    sp = fixed.spans.set_index("step")
    moved = sp[sp.lane == S.COMPUTE]
    assert moved.at[0, "ts"] == pytest.approx(700.0 - POST_GRAPH_HOST_US)
    assert moved.at[0, "end"] == pytest.approx(9100.0)  # ends where it ended
    assert moved.at[1, "ts"] == 9100.0 and moved.at[2, "ts"] == 17300.0
    assert fixed.other_data["graph_start_corrected"] == 1
    sim = TraceBuilder("sim", {})
    sim.span(S.HOST, S.LAUNCH, 0.0, 700.0, step=0)
    sim.span(S.COMPUTE, S.GRAPH_REPLAY, 100.0, 9000.0, step=0)
    built = sim.build()
    assert correct_graph_start(built) is built  # simulated forwards start after their launch


def test_a_piecewise_replay_keeps_its_start():
    """A step replayed from piecewise graphs (args.pieces > 1) starts its first piece while the
    host launches the rest: the correction that moves step 0's whole graph leaves it."""
    b = TraceBuilder("runtime", {})
    b.span(S.HOST, S.LAUNCH, 0.0, 700.0, step=0)
    b.span(S.COMPUTE, S.GRAPH_REPLAY, 100.0, 9000.0, step=0, pieces=33)
    built = b.build()
    assert correct_graph_start(built) is built


def test_a_trace_may_carry_its_own_post_graph_host_time():
    fixed = correct_graph_start(graph_trace(other={"post_graph_host_us": 200.0}))
    fwd = fixed.spans[fixed.spans.lane == S.COMPUTE].set_index("step")
    assert fwd.at[0, "ts"] == pytest.approx(500.0)


def test_normalising_twice_changes_nothing_more():
    once = normalize(drifted())
    assert normalize(once).events == once.events
    g = normalize(graph_trace())
    assert normalize(g).events == g.events


def test_a_runtime_trace_read_back_is_already_normalised(tmp_path):
    """The runtime writes its trace normalised; a raw one is normalised on read: both give the
    same timings, so a run's metrics.json and a later validation agree."""
    raw = drifted()
    path = write_trace(raw, tmp_path / "raw.json")
    back = read_trace(path)
    assert back.events == normalize(raw).events
    assert back.other_data["clock_drift_corrected"]
    written = write_trace(normalize(raw), tmp_path / "fixed.json")
    assert read_trace(written).events == back.events
