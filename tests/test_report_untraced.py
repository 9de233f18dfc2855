"""The report of a simulation that keeps no trace: the windows of spans its recorder keeps are
the trace's spans in those windows (the very windows the trace's report picks when the run is
folded at once), in a bounded number of rows however long the run; its per-step series, stalls,
hazards and idle time are the trace's; the page says what it shows."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from conftest import make_config
from sim_harness import make

from cbsim.config import ConfigError
from cbsim.metrics import MetricInputs
from cbsim.report.frames import detail_windows, run_frames
from cbsim.report.untraced import UntracedRun, untraced_frames
from cbsim.sim import simulate
from cbsim.trace.window import GROWTH, StepWindows, overlapping

# what a window's bars show of each span
SHOWN = ["lane", "name", "ts_ms", "end_ms", "dur_us", "step", "slot", "requests"]
SHOWN += ["query_tokens", "kv_tokens", "kind"]


def with_stalls(cfg, every: int = 40):
    host = dataclasses.replace(cfg.hardware.host, stall_us=3000.0, stall_every_steps=every)
    return dataclasses.replace(cfg, hardware=dataclasses.replace(cfg.hardware, host=host))


def both(cfg, engine: str, chunk: int = 1 << 15, fast_forward: bool = True):
    """The report's frames of the run's trace, and of the same run without one."""
    trace = simulate(cfg, engine, want_trace=True, fast_forward=fast_forward).trace
    res = simulate(cfg, engine, chunk=chunk, window=6, fast_forward=fast_forward)
    run = UntracedRun(MetricInputs(**res.tables), res.windows.windows, 6, res.windows.hazards)
    return run_frames(engine, trace), untraced_frames(engine, run), res


def rows(spans: pd.DataFrame, a: float, b: float) -> pd.DataFrame:
    sp = spans[(spans["end_ms"] >= a) & (spans["ts_ms"] <= b)][SHOWN].copy()
    sp["lane"] = sp["lane"].astype(str)
    return sp.sort_values(["ts_ms", "lane", "name"]).reset_index(drop=True)


def assert_same_rows(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert len(a) == len(b) > 0
    for col in SHOWN:
        if col in ("ts_ms", "end_ms", "dur_us"):
            assert np.allclose(a[col], b[col], rtol=0, atol=1e-9), col
        else:
            assert a[col].astype(str).tolist() == b[col].astype(str).tolist(), col


@pytest.mark.parametrize(
    "engine,chunk,fast_forward",
    [
        ("sync", 1 << 15, True),
        ("async", 1 << 15, False),
        ("async", 700, True),
        ("sync", 700, False),
    ],
)
def test_kept_windows_hold_the_trace_s_spans_and_the_fold_its_steps(engine, chunk, fast_forward):
    cfg = with_stalls(make(batch_size=4, num_requests=8, prompt_len=64, gen_len=300))
    traced, untraced, _ = both(cfg, engine, chunk, fast_forward)
    windows = untraced.windows
    assert [w[0].split(":")[0] for w in windows] == ["first steps", "steady state", "end"]
    offline = detail_windows(traced.steps, traced.spans)
    if chunk > 1000:  # folded at once: the very windows of the trace's report
        assert [w[0] for w in windows] == [w[0] for w in offline]
        assert np.allclose([w[1:] for w in windows], [w[1:] for w in offline], atol=1e-9)
    else:  # folded as it ran: the same first and end windows, a steady one near the middle
        assert [windows[i][0] for i in (0, 2)] == [offline[i][0] for i in (0, 2)]
        middle = int(windows[1][0].rsplit(" ", 1)[1].split("-")[0]) + 3
        assert abs(middle - len(traced.steps) / 2) < 0.2 * len(traced.steps)
    for _, a, b in windows:
        assert_same_rows(rows(traced.spans, a, b), rows(untraced.spans, a, b))
    # the per-step series of every step, from the fold
    t, u = traced.steps, untraced.steps
    assert t["step"].tolist() == u["step"].tolist() and t["kind"].tolist() == u["kind"].tolist()
    for col in ("end_ms", "step_ms", "gpu_ms", "exposed_ms"):
        assert np.allclose(t[col], u[col], rtol=1e-9, atol=1e-9), col
    assert untraced.idle_ms == pytest.approx(traced.idle_ms, rel=1e-9)
    # the stalls in the windows: the trace's that fall there, against the whole run's medians
    inside = pd.concat([rows_of(traced.stalls, a, b) for _, a, b in windows]).drop_duplicates()
    assert len(inside) > 0
    assert sorted(inside["ts_ms"].round(6)) == sorted(untraced.stalls["ts_ms"].round(6))
    assert np.allclose(sorted(inside["median_ms"]), sorted(untraced.stalls["median_ms"]))


def rows_of(frame: pd.DataFrame, a: float, b: float) -> pd.DataFrame:
    return frame[(frame["end_ms"] >= a) & (frame["ts_ms"] <= b)]


def test_hazards_keep_their_first_rows_and_every_count():
    cfg = make(engine={"io_slots": 1}, batch_size=3, gen_len=60, ignore_eos=False)
    traced, untraced, _ = both(cfg, "async", chunk=200)
    counts = traced.hazards_by_kind()
    assert sum(counts.values()) > 20 and untraced.hazards_by_kind() == counts
    assert len(untraced.hazards) == 20
    first = traced.hazards.sort_values("ts_ms", kind="stable").head(20).reset_index(drop=True)
    for col in ("lane", "kind", "detail"):
        assert untraced.hazards[col].astype(str).tolist() == first[col].astype(str).tolist()
    for col in ("ts_ms", "step", "slot"):
        assert np.allclose(untraced.hazards[col].astype(float), first[col].astype(float)), col


def test_a_long_run_s_windows_stay_a_few_windows_and_the_steady_one_near_the_middle():
    """A trace's spans fed chunk by chunk: the rows held never pass a few windows' worth, and
    the windows drawn are the trace's spans of those windows."""
    trace = simulate(make(batch_size=4, num_requests=4, gen_len=3000), "async", True).trace
    spans = trace.spans.sort_values("ts", kind="stable").reset_index(drop=True)
    ts = spans["ts"].to_numpy()
    cuts = [i for i in range(1500, len(spans), 1500) if ts[i] > ts[i - 1]]
    win = StepWindows(6)
    held, waiting = [], []
    for lo, hi in zip([0, *cuts], [*cuts, len(spans)]):
        win.add(spans.iloc[lo:hi], float(ts[hi]) if hi < len(spans) else None)
        kept = [*win.first, win.tail, *(c.spans for c in win.candidates), *(win.whole or [])]
        held.append(sum(len(k) for k in kept if k is not None))
        waiting.append(len(win.candidates))
    steps, per_step = win.steps, len(spans) / win.steps
    assert steps >= 3000 and len(cuts) > 10
    bound = (3 + np.log(2) / np.log(GROWTH) + 2) * 6 * per_step + 2 * 1500
    assert max(held) < bound < len(spans) / 4, (max(held), bound)
    assert max(waiting) <= np.log(2) / np.log(GROWTH) + 2
    first, steady, end = win.finish()
    assert abs(steady.pos + 3 - steps / 2) < 0.15 * steps
    for w in (first, steady, end):
        expected = overlapping(spans, w.t0, w.t1)
        assert len(w.spans) == len(expected)
        key = ["lane", "name", "ts", "dur"]
        got = w.spans[key].astype(str).sort_values(key).to_numpy()
        assert (got == expected[key].astype(str).sort_values(key).to_numpy()).all()


def test_a_short_run_is_kept_whole():
    cfg = make(batch_size=2, num_requests=2, gen_len=10)
    traced, untraced, res = both(cfg, "sync", chunk=30)
    assert [w[0] for w in untraced.windows] == ["whole run"]
    assert_same_rows(rows(traced.spans, 0, np.inf), rows(untraced.spans, 0, np.inf))


def test_report_window_steps_is_checked():
    with pytest.raises(ConfigError, match=r"^output.report_window_steps=0 is out of range; "):
        make_config(["output.report_window_steps=0"])
    assert make_config(["output.report_window_steps=100"]).output.report_window_steps == 100


def test_max_chart_points_is_checked():
    with pytest.raises(ConfigError, match=r"^output.max_chart_points=99 is out of range; "):
        make_config(["output.max_chart_points=99"])
    assert make_config(["output.max_chart_points=100"]).output.max_chart_points == 100


def test_the_page_without_a_trace_says_what_its_timeline_shows(tmp_path):
    from cbsim.app import run_engines

    base = ["engine=compare", "model=llama3_1b", "workload.batch_size=4"]
    base += ["workload.num_requests=8", "workload.gen_len=200", "mode.bands=false"]
    base += ["output.report=true", "output.print_table=false", "output.progress=false"]
    pages, metrics = {}, {}
    for keep in ("true", "false"):
        cfg = make_config([*base, f"output.trace={keep}", "output.report_window_steps=5"])
        (tmp_path / keep).mkdir()
        metrics[keep] = run_engines(cfg, dataclasses.asdict(cfg), tmp_path / keep)
        pages[keep] = (tmp_path / keep / "report.html").read_text()
    assert sorted(p.name for p in (tmp_path / "false").iterdir()) == ["report.html"]
    kept, alone = pages["true"], pages["false"]
    line = "the timeline shows windows of 5 steps (output.report_window_steps)"
    assert line in alone and line not in kept
    assert "timelineDetail" in kept or "Every span is drawn" in kept
    assert "Every span is drawn" not in alone and "timelineDetail" not in alone
    assert "trace_sync.json.gz" in kept and "trace_sync.json" not in alone
    assert "No trace was kept" in alone
    assert metrics["true"]["comparison"] == metrics["false"]["comparison"]
    for engine in ("sync", "async"):
        steps = metrics["false"][engine]["steps"]
        assert f"steps {steps - 5}-{steps - 1}" in alone  # the end window


def test_a_long_run_s_step_time_lines_hold_at_most_the_cap(tmp_path):
    """60,000 steps without a trace: the page's step-time lines keep at most
    output.max_chart_points points each, its largest step kept, and the chart says it is
    thinned."""
    import json
    import re

    from cbsim.app import run_engines

    cfg = make_config(
        ["engine=sync", "model=llama3_1b", "workload.batch_size=1", "workload.num_requests=4"]
        + ["workload.gen_len=15000", "mode.bands=false", "output.trace=false"]
        + ["output.report=true", "output.print_table=false", "output.progress=false"]
        + ["output.max_chart_points=1000"]
    )
    metrics = run_engines(cfg, dataclasses.asdict(cfg), tmp_path)
    page = (tmp_path / "report.html").read_text()
    found = re.search(r'id="fig-\d+-step_time-data">(.*?)</script>', page, re.S)
    fig = json.loads(found.group(1).replace("<\\/", "</"))
    lines = [t for t in fig["data"] if t.get("mode") == "lines"]
    assert metrics["steps"] >= 50_000 and len(lines) == 2
    for t in lines:
        x, y = plotted(t["x"]), plotted(t["y"])
        assert 500 <= len(x) <= 1000 and len(x) == len(y)
        assert (np.diff(x) > 0).all()
    y = plotted(lines[0]["y"])
    assert y.max() >= metrics["step_time_ms_p99"] and y.min() <= metrics["step_time_ms_p50"]
    assert "Thinned: the min and max of each 120-step bucket" in fig["layout"]["title"]["text"]
    assert len(found.group(1)) < 100_000  # every step's two lines: over 2 MB


def plotted(values) -> np.ndarray:
    """A trace's array as plotly writes it: a list, or typed base64 (bdata)."""
    if isinstance(values, dict):
        import base64

        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"])
    return np.asarray(values)
