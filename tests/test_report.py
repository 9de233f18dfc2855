"""The run report: the tables it draws from a trace, and the HTML it writes (no browser here)."""

from __future__ import annotations

import re
import time

import numpy as np
import plotly.graph_objects as go
import pytest
from conftest import make_config
from synthetic_trace import loop_trace

from cbsim.metrics import compute_metrics, why_line
from cbsim.report import write_run_report
from cbsim.report.charts import binned_steps, envelope_index
from cbsim.report.frames import (
    busy_before,
    detail_windows,
    idle_gaps,
    run_frames,
    steady_start,
    union_intervals,
)
from cbsim.report.timeline import detail_figure, overview_figure, overview_style
from cbsim.trace import TraceBuilder
from cbsim.trace import schema as S


def runs_of(steps: int, engines=("sync", "async"), hazards: int = 0):
    out = {}
    for e in engines:
        t = loop_trace(e, steps, hazards=hazards if e == "async" else 0)
        out[e] = (t, compute_metrics(t))
    return out


def test_union_and_busy_time():
    s, e = union_intervals(np.array([5.0, 0.0, 2.0, 10.0]), np.array([6.0, 3.0, 4.0, 12.0]))
    assert s.tolist() == [0.0, 5.0, 10.0] and e.tolist() == [4.0, 6.0, 12.0]
    assert busy_before(s, e, np.array([-1.0, 2.0, 4.5, 5.5, 100.0])).tolist() == [
        0.0,
        2.0,
        4.0,
        4.5,
        7.0,
    ]


def test_idle_gaps_steps_and_exposed_time():
    b = TraceBuilder("sim", {"engine": "sync"})
    # two steps: forward 0-10 ms, then 15-20 ms; the host works in between
    b.span(S.HOST, S.PREPARE, 0.0, 1000.0, step=0)
    b.span(S.COMPUTE, S.GRAPH_REPLAY, 0.0, 10_000.0, step=0, new_tokens=4)
    b.span(S.HOST, S.PREPARE, 10_000.0, 5000.0, step=1)
    b.span(S.COMPUTE, S.GRAPH_REPLAY, 15_000.0, 5000.0, step=1, new_tokens=4)
    b.span(S.D2H, S.COPY_D2H, 20_000.0, 1000.0, step=1)
    f = run_frames("sync", b.build())
    assert f.total_ms == pytest.approx(21.0)
    assert f.idle[["ts_ms", "end_ms"]].values.tolist() == [[10.0, 15.0], [20.0, 21.0]]
    assert f.steps["step_ms"].tolist() == [10.0, 10.0]
    assert f.steps["gpu_ms"].tolist() == [10.0, 5.0]
    assert f.steps["exposed_ms"].tolist() == [0.0, 5.0]
    assert f.rows == [S.HOST, S.H2D, S.COMPUTE, "GPU idle", S.D2H]
    assert idle_gaps(f.spans[f.spans.lane == S.COMPUTE], 0.0, 20.0)["dur_us"].tolist() == [5000.0]


@pytest.mark.parametrize("engine", ["sync", "async"])
def test_idle_share_matches_the_metrics(engine):
    trace = loop_trace(engine, 200)
    f = run_frames(engine, trace)
    idle = f.idle["dur_us"].sum() / 1e3 / f.total_ms
    assert idle == pytest.approx(compute_metrics(trace)["gpu_idle_fraction"], abs=1e-9)
    # steps as metrics count them, and step = GPU busy + exposed
    assert len(f.steps) == 200
    assert np.allclose(f.steps["gpu_ms"] + f.steps["exposed_ms"], f.steps["step_ms"])


def test_overview_style_follows_the_span_count():
    small, medium, large = (
        [run_frames(e, loop_trace(e, n)) for e in ("sync", "async")] for n in (40, 300, 1200)
    )
    assert [overview_style(r) for r in (small, medium, large)] == ["bars", "segments", "bins"]
    kinds = [{type(t) for t in overview_figure(r).data} for r in (small, medium, large)]
    assert go.Bar in kinds[0] and go.Scattergl in kinds[1] and go.Heatmap in kinds[2]
    detail = detail_figure(large)
    assert [a.text for a in detail.layout.annotations][:3] == [
        "sync · first steps: steps 0-5",
        "sync · steady state: steps 597-602",
        "sync · end: steps 1194-1199",
    ]


def test_binned_steps_bound_the_bar_count():
    steps = run_frames("sync", loop_trace("sync", 1000)).steps
    binned, size = binned_steps(steps, max_bars=400)
    assert size == 3 and len(binned) == 334
    assert binned["first"].iloc[1] == 3 and binned["last"].iloc[-1] == 999
    assert binned_steps(steps.head(100))[1] == 1


@pytest.mark.parametrize("n,cap", [(100_000, 1000), (100_001, 999), (5000, 100)])
def test_a_long_series_keeps_each_bucket_s_min_and_max_within_the_cap(n, cap):
    rng = np.random.default_rng(n)
    y = rng.normal(10.0, 0.5, n)
    y[[7, n // 3, n - 1]] = [500.0, 0.01, 300.0]  # a stall, a dip, a spike on the last step
    at, size = envelope_index(y, cap)
    assert size > 1 and len(at) <= cap and len(at) >= cap // 2
    assert (np.diff(at) > 0).all()  # real steps, in order: x stays monotone
    assert {7, n // 3, n - 1} <= set(at.tolist())
    assert y[at].max() == y.max() and y[at].min() == y.min()
    for b in (0, 17, (n - 1) // size):  # every bucket's own extremes
        part = y[b * size : (b + 1) * size]
        assert {part.max(), part.min()} <= set(y[at].tolist())


def test_a_series_within_the_cap_is_drawn_whole():
    y = np.arange(400.0)
    at, size = envelope_index(y, 400)
    assert size == 1 and at.tolist() == list(range(400))


def test_single_run_report_is_self_contained(tmp_path):
    cfg = make_config(["engine=sync"])
    path = write_run_report(runs_of(30, ("sync",)), cfg, tmp_path / "report.html")
    html = path.read_text()
    assert html.startswith("<!DOCTYPE html>") and len(html) > 3_000_000  # plotly.js inline
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=|@import|url\(http", html)
    assert "sync: 0." in html and "GPU idle" in html
    assert "<code>trace.json.gz</code>" in html and "ui.perfetto.dev" in html
    assert "chrome://tracing" in html and "Hazards" not in html
    assert html.count('class="cbsim-plot"') == 4  # split, timeline (bars), step time, stacked


def test_compare_report_has_both_engines_and_hazards(tmp_path):
    cfg = make_config(["engine=compare", "output.trace_gzip=true"])
    runs = runs_of(60, hazards=2)
    html = write_run_report(runs, cfg, tmp_path / "r" / "report.html").read_text()
    speedup = runs["sync"][1]["total_time_s"] / runs["async"][1]["total_time_s"]
    assert f"x{speedup:.3f}" in html and "Async batching pays" in html
    assert "trace_sync.json.gz" in html and "trace_async.json.gz" in html
    assert "Hazards: 2" in html and "slot_overwrite" in html
    assert "async vs sync" in html


def test_report_at_the_seed_size_builds_quickly(tmp_path):
    runs = runs_of(8192)
    assert sum(len(t.spans) for t, _ in runs.values()) > 100_000
    t0 = time.perf_counter()
    path = write_run_report(runs, make_config(["engine=compare"]), tmp_path / "report.html")
    took = time.perf_counter() - t0
    size_mb = path.stat().st_size / 1e6
    print(f"8192-step compare report: built in {took:.2f} s, {size_mb:.1f} MB")
    assert took < 30 and size_mb < 15
    assert "time bins" in path.read_text()


@pytest.mark.parametrize("shape", ["empty", "host only", "default stream"])
def test_odd_traces_still_make_a_report(tmp_path, shape):
    b = TraceBuilder("sim", {"engine": "sync"})
    for i in range(30 if shape != "empty" else 0):
        b.span(S.HOST, S.PREPARE, i * 100.0, 30.0, step=i)
        if shape == "default stream":
            b.span(S.DEFAULT, S.FORWARD, i * 100.0 + 30, 60.0, step=i, new_tokens=1)
    t = b.build()
    path = write_run_report({"sync": (t, compute_metrics(t))}, make_config(), tmp_path / "r.html")
    html = path.read_text()
    assert html.count('class="cbsim-plot"') == 4
    if shape == "default stream":
        f = run_frames("sync", t)
        assert f.gpu_lane == S.DEFAULT and S.DEFAULT in f.rows
        assert f.idle["dur_us"].sum() == pytest.approx(30 * 30.0 + 29 * 10.0)


def test_binned_lanes_are_as_deep_as_they_are_busy():
    from cbsim.report.bins import LEVELS, _phase_scale, shade_level

    # a stream busy 0.02% of a bin gets the palest of LEVELS depths: nearly white
    assert shade_level(np.array([0.0002, 0.5, 1.0])).tolist() == [0, LEVELS / 2 - 1, LEVELS - 1]
    palest = _phase_scale([S.COPY_H2D])[0][1]
    assert min(int(c) for c in re.findall(r"\d+", palest)) > 235
    fig = overview_figure([run_frames(e, loop_trace(e, 1200)) for e in ("sync", "async")])
    bars = [t for t in fig.data if t.meta == "share-legend"]
    assert len(bars) == 1 and "busy in the bin (%)" in bars[0].colorbar.title.text
    assert bars[0].colorbar.ticksuffix == "%"


def test_long_runs_have_a_time_axis_in_seconds():
    short = [run_frames("sync", loop_trace("sync", 40))]
    long = [run_frames("sync", loop_trace("sync", 8192))]
    assert "(ms)" in overview_figure(short).layout.xaxis.title.text
    assert long[0].total_ms > 10_000
    assert "(s)" in overview_figure(long).layout.xaxis.title.text


def test_zoom_payload_holds_every_span_to_a_tenth_of_a_microsecond():
    from cbsim.report.zoom import TICKS_PER_MS, zoom_payload

    frames = [run_frames(e, loop_trace(e, 300)) for e in ("sync", "async")]
    payload = zoom_payload(frames, 1.0, "ms")
    assert [r["xaxis"] for r in payload["runs"]] == ["x", "x2"]
    for run, f in zip(payload["runs"], frames):
        assert sum(len(g["ts"]) for g in run["groups"]) == len(f.spans) + len(f.idle)
        g = next(g for g in run["groups"] if g["name"] == S.GRAPH_REPLAY)
        starts = np.cumsum(g["ts"]) / TICKS_PER_MS
        spans = f.spans[f.spans.name == S.GRAPH_REPLAY].sort_values("ts_ms")
        assert np.allclose(starts, spans["ts_ms"], atol=1e-4)
        assert np.cumsum(g["step"]).tolist() == spans["step"].tolist()


def test_step_time_axis_is_clipped_to_the_steady_state_and_marks_the_rest():
    from cbsim.report.charts import step_time_figure

    f = run_frames("sync", loop_trace("sync", 400))
    f.steps.loc[f.steps.index[[0, 200]], "step_ms"] = 500.0  # a prefill and a stall
    fig = step_time_figure([f])
    top = fig.layout.yaxis.range[1]
    assert top < 50
    marks = [t for t in fig.data if "above the axis" in (t.name or "")]
    assert len(marks) == 1 and marks[0].x.tolist() == [0, 200]
    assert [float(row[0]) for row in marks[0].customdata] == [500.0, 500.0]


def test_stalls_and_prefill_steps_are_marked_on_the_timeline():
    b = TraceBuilder("sim", {"engine": "sync"})
    for i in range(60):
        t = i * 10_000.0
        kind = "prefill" if i == 0 else "decode"
        upd = 50_000.0 if i == 30 else 1000.0  # one stall: 50x the median update
        b.span(S.HOST, S.UPDATE, t, upd, step=i, kind=kind)
        b.span(S.COMPUTE, S.GRAPH_REPLAY, t + 2000, 5000.0, step=i, kind=kind, new_tokens=1)
    f = run_frames("sync", b.build())
    assert f.stalls["step"].tolist() == [30] and f.stalls["name"].tolist() == [S.UPDATE]
    names = {t.name for t in overview_figure([f]).data}
    assert {"host stall", "prefill / mixed step"} <= names
    from cbsim.report.charts import step_causes

    causes = step_causes(f)  # what the step-time chart's hover says of a step above its axis
    assert causes[0] == "prefill step"
    assert causes[35] == "host stall: update 50.0 ms"  # the first step ending after the stall


def test_a_run_that_does_not_fit_the_device_says_so_first(tmp_path):
    runs = runs_of(30, ("sync",))
    runs["sync"][1].update(
        fits_device=False, device_bytes_needed=200e9, device_bytes_available=141e9
    )
    html = write_run_report(runs, make_config(["engine=sync"]), tmp_path / "r.html").read_text()
    assert "does not fit the device: it needs 200.0 GB of the device&#x27;s 141.0 GB" in html


def test_bands_show_as_a_table_when_given_or_recorded(tmp_path):
    band = {"p5": 1.0, "median": 1.1, "p95": 1.2}
    bands = {
        "draws": 8,
        "quantiles": ["p5", "median", "p95"],
        "sync": {
            "total_time_s": band,
            "gpu_idle_fraction": {"p5": 0.2, "median": 0.21, "p95": 0.25},
        },
        "async": {"total_time_s": band, "gpu_idle_fraction": band},
        "speedup": {"p5": 1.25, "median": 1.3, "p95": 1.31},
    }
    runs = runs_of(30)
    cfg = make_config(["engine=compare"])
    html = write_run_report(runs, cfg, tmp_path / "a.html", bands=bands).read_text()
    assert "bands over 8 host-speed draws" in html
    assert "<td>async speedup</td><td>x1.250</td><td>x1.300</td><td>x1.310</td>" in html
    assert "<td>sync GPU idle</td><td>20.00%</td><td>21.00%</td><td>25.00%</td>" in html
    runs["sync"][0].other_data["bands"] = bands
    assert "host-speed draws" in write_run_report(runs, cfg, tmp_path / "b.html").read_text()


def test_detail_windows_of_a_long_run_are_in_milliseconds():
    long = [run_frames("sync", loop_trace("sync", 8192))]
    fig = detail_figure(long)
    assert fig.layout.xaxis.title.text == "ms since the run's start"
    t0, t1 = fig.layout.xaxis2.range
    assert t1 > 10_000 and t1 - t0 < 100, "the steady window: a few steps, in ms"


def test_the_steady_window_stays_away_from_a_stall():
    trace = loop_trace("async", 400)
    frames = run_frames("async", trace)
    steps = frames.steps.copy()
    middle = steps["step"].to_numpy()[len(steps) // 2]
    steps.loc[steps["step"] == middle, "step_ms"] += 55.0  # a 55 ms update stall mid-run
    (_, a, b), (label, t0, t1), _ = detail_windows(steps, frames.spans)
    first = steady_start(steps)
    inside = steps["step"].to_numpy()[first : first + 6]
    assert middle not in inside and label.startswith("steady state")
    assert abs(first - len(steps) // 2) < 12, "still near the middle"


def test_waiting_is_drawn_thin_and_not_busy_so_the_overlap_shows():
    small = [run_frames("async", loop_trace("async", 40))]
    fig = overview_figure(small)
    width = {t.name: t.width for t in fig.data if t.type == "bar"}
    assert width[S.WAIT] < width[S.PREPARE] / 2
    big = [run_frames("sync", loop_trace("sync", 4000))]
    binned = overview_figure(big)
    host = [
        t for t in binned.data if t.type == "heatmap" and "<b>host</b>" in (t.hovertemplate or "")
    ]
    assert len(host) == 1 and "wait" not in " ".join(host[0].text[0][:50])
    busy = np.array([float(c.split("%")[0].split()[-1]) for c in host[0].text[0][5:-5]])
    assert busy.mean() < 40, "the host works 900 of each 3,700 us: most of the lane is white"


def test_short_spans_get_a_tick_that_keeps_them_visible():
    fig = overview_figure([run_frames("sync", loop_trace("sync", 40))])
    ticks = {t.name: len(t.x) for t in fig.data if t.meta == "short"}
    assert ticks.get(S.COPY_H2D) == 40 and ticks.get(S.COPY_D2H) == 40  # 20 us in a 150 ms run
    assert S.GRAPH_REPLAY not in ticks and S.WAIT not in ticks
    detail = detail_figure([run_frames("sync", loop_trace("sync", 40))])
    shown = {t.name for t in detail.data if t.meta == "short"}
    assert S.COPY_H2D in shown, "20 us in a 6-step window of 22 ms is under 2 px too"


@pytest.mark.parametrize("source", ["sim", "runtime"])
def test_the_why_weighs_host_work_per_step_against_the_forward(source):
    b = TraceBuilder(source, {"engine": "sync"})
    t = 0.0
    for step in range(4):  # 0.49 ms of host work, a wait, then a 1.28 ms forward, each step
        for name, dur in ((S.SCHEDULE, 60.0), (S.PREPARE, 100.0), (S.LAUNCH, 250.0)):
            b.span(S.HOST, name, t, dur, step=step)
            t += dur
        b.span(S.COMPUTE, S.FORWARD, t, 1280.0, step=step, new_tokens=4)
        b.span(S.HOST, S.WAIT, t, 1280.0, step=step)
        t += 1280.0
        b.span(S.HOST, S.UPDATE, t, 80.0, step=step)
        t += 80.0
    m = compute_metrics(b.build())
    assert m["host_work_ms_per_step"] == pytest.approx(0.49)
    assert m["gpu_ms_per_step"] == pytest.approx(1.28)
    assert m["hideable_fraction"] == pytest.approx(0.49 / 1.77)
    assert why_line({"sync": m, "async": m}) == (
        "Why: in sync, the host works 0.49 ms a step (launch, prepare, update, schedule) "
        "against a 1.28 ms forward; at most 28% of a step is there to hide."
    )


H100 = {
    "basis": "device",
    "name": "NVIDIA H100 80GB HBM3",
    "sms": 132,
    "memory_bytes": 85_017_624_576,
    "capability": "9.0",
    "copy_bytes_per_s": 3.03e12,
    "copy_of": "device memory",
    "host_cpu": "Intel(R) Xeon(R) Platinum 8480+",
    "host_cores": 16,
    "host_ram_bytes": 128 * 2**30,
    "host_python_us": 1850.0,
    "host_torch_op_us": 1.25,
}


def test_a_recordings_report_names_its_gpu_its_profile_and_the_floors_rate(tmp_path):
    from dataclasses import asdict

    cfg = make_config(["engine=sync"])  # the default profile: h200
    trace = loop_trace("sync", 30)
    trace.other_data.update(source="runtime", hardware=H100, config=asdict(cfg))
    runs = {"sync": (trace, compute_metrics(trace))}
    html = write_run_report(runs, cfg, tmp_path / "report.html").read_text()
    assert "llama3_8b on NVIDIA H100 80GB HBM3 (profile h200)" in html
    assert "132 SMs · 79.2 GiB · compute 9.0 · copy 3.03 TB/s measured" in html
    assert (
        "Xeon(R) Platinum 8480+ · 16 cores · 128 GiB RAM · Python work 1.85 ms · torch op 1.25 us"
        in html
    )
    assert "3.03 TB/s (measured copy rate)" in html  # what "of the HBM floor" divides by
    assert "calibrated from 60 runtime traces of h200/fit_a, h200/fit_b, h200/fit_padded" in html


def test_a_profiles_source_reads_in_a_line_not_as_its_trace_files():
    from cbsim.report.machine import profile_source

    files = [f"run{i // 20}/case_{i}/trace_{e}.json.gz" for i in range(30) for e in ("a", "s")]
    source = f"calibrated from {len(files)} runtime trace(s): " + ", ".join(files)
    assert profile_source(source) == "calibrated from 60 runtime traces of run0, run1"
    assert profile_source("H100 datasheet") == "H100 datasheet"
    assert len(profile_source("x" * 1000)) == 300


def test_titles_name_a_kineto_imports_device_and_a_simulations_profile():
    from cbsim.report.run_report import page_title

    kineto = TraceBuilder("kineto", {"kineto": {"devices": ["NVIDIA H200"]}}).build()
    assert page_title(["trace"], None, [kineto]).endswith("kineto trace on NVIDIA H200")
    cfg = make_config(["engine=sync"])
    sim = loop_trace("sync", 3)
    assert "llama3_8b on h200 · batch" in page_title(["sync"], cfg, [sim])
