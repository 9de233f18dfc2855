"""sweep.html: units on every colourbar, axis titles, infeasible settings marked, crossovers only
between measured settings, one shared plotly.js per sweep directory."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from test_sweep import SWEEP, make_sweep

from cbsim.report.html import PLOTLY_FILE
from cbsim.report.sweep_figures import FITS, brackets, heatmap_figure, lines_figure
from cbsim.rundir import write_finished
from cbsim.sweep import write_summary
from cbsim.sweep.report import verdict
from cbsim.sweep.verdict import range_words


def comp_table(fits: bool = True) -> pd.DataFrame:
    rows = []
    for b, s in zip([1, 8, 32, 128], [0.98, 1.02, 1.1, 1.3]):
        for g in (1024, 32768):
            rows.append(
                {
                    "workload.batch_size": b,
                    "workload.gen_len": g,
                    "speedup": s + (0.01 if g > 1024 else 0),
                    "gpu_idle_sync": 0.2,
                    "gpu_idle_async": 0.01,
                    FITS: fits or not (b == 128 and g == 32768),
                }
            )
    return pd.DataFrame(rows)


def test_heatmaps_have_colourbars_with_units_and_axis_titles():
    fig = heatmap_figure(comp_table(), "workload.batch_size", "workload.gen_len", 1.05)
    bars = [t.colorbar.title.text for t in fig.data if t.showscale is not False]
    assert bars == ["speedup (x)", "GPU idle (%)"]
    idle = fig.data[1]
    assert idle.z.max() == pytest.approx(20.0)  # percent, as the cells say
    assert [fig.layout[f"yaxis{s}"].title.text for s in ("", "2", "3")] == ["workload.gen_len"] * 3
    assert [fig.layout[f"xaxis{s}"].title.text for s in ("", "2", "3")] == [
        "workload.batch_size"
    ] * 3


def test_settings_that_do_not_fit_are_greyed_out():
    fig = heatmap_figure(comp_table(fits=False), "workload.batch_size", "workload.gen_len", 1.05)
    grey = [t for t in fig.data if t.hovertemplate.startswith("does not fit")]
    assert len(grey) == 3
    assert sum(v == 1.0 for row in grey[0].z for v in row) == 1  # the one cell, in each panel
    assert "no fit" in fig.data[0].text[1][3]


def test_a_crossover_is_the_interval_between_measured_settings():
    assert brackets([8, 32, 128], [1.0, 1.1, 1.2], 1.05) == [((8, 32), pytest.approx(0.5))]
    assert brackets([8, 32], [1.1, 1.2], 1.05) == []
    fig = lines_figure(comp_table(), "workload.batch_size", "workload.gen_len", 1.05)
    marks = [t for t in fig.data if "stops paying between" in (t.hovertemplate or "")]
    assert {tuple(t.x) for t in marks} == {(8.0, 32.0)}
    assert all(list(t.y) == [1.05, 1.05] for t in marks)


def test_a_two_value_axis_shows_its_two_values_only():
    fig = lines_figure(comp_table(), "workload.gen_len", "workload.batch_size", 1.05)
    assert fig.layout.xaxis.type == "linear"  # two values: no log axis and its minor ticks
    assert list(fig.layout.xaxis.tickvals) == [1024.0, 32768.0]
    fig = lines_figure(comp_table(), "workload.batch_size", "workload.gen_len", 1.05)
    assert fig.layout.xaxis.type == "log" and list(fig.layout.xaxis.ticktext) == [
        "1",
        "8",
        "32",
        "128",
    ]
    assert fig.layout.yaxis2.title.text == "GPU idle (%)"


def test_sweep_page_marks_infeasible_jobs_and_shares_plotly(tmp_path):
    sweep = make_sweep(tmp_path / "sw", SWEEP)
    for job in sweep.iterdir():
        ov = job / ".hydra" / "overrides.yaml"
        if ov.is_file() and "workload.batch_size=128" in ov.read_text():
            m = json.loads((job / "metrics.json").read_text())
            (job / "metrics.json").write_text(json.dumps({**m, FITS: False}))
            write_finished(job, {"job": job.name}, ["metrics.json"])
    page = write_summary(sweep).html
    html = page.read_text()
    assert "2 settings do not fit the device" in html
    assert f'<script src="{PLOTLY_FILE}"></script>' in html
    assert (sweep / PLOTLY_FILE).stat().st_size > 3_000_000
    assert page.stat().st_size < 300_000


def test_job_reports_of_a_sweep_share_its_plotly(tmp_path):
    from conftest import run_cli

    sweep = tmp_path / "sw"
    args = ["-m", "engine=sync,async", "model=tiny", "workload.batch_size=4"]
    args += ["workload.gen_len=16", "output.report=true", f"hydra.sweep.dir={sweep}"]
    r = run_cli(args, cwd=tmp_path, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (sweep / PLOTLY_FILE).is_file() and not (sweep / "0" / PLOTLY_FILE).exists()
    for job in ("0", "1"):
        page = sweep / job / "report.html"
        assert f'<script src="../{PLOTLY_FILE}"></script>' in page.read_text()
        assert page.stat().st_size < 300_000


def test_the_speedup_colours_are_centred_on_the_threshold_not_on_one():
    fig = heatmap_figure(comp_table(), "workload.batch_size", "workload.gen_len", 1.05)
    cells = fig.data[0]
    assert cells.zmid == 1.05 and (cells.zmin + cells.zmax) / 2 == pytest.approx(1.05)
    assert cells.zmin < 1.046 < cells.zmid, "x1.046 does not pay: it takes the red half"


def test_the_verdict_states_the_boundary_in_words():
    comp = comp_table()
    keys = ["workload.batch_size", "workload.gen_len"]
    assert verdict(comp, keys, 1.05) == (
        "Async pays ≥ 5% at batch_size ≥ 32 (speedup x0.980 to x1.310 over 8 settings)."
    )
    assert verdict(comp, keys, 1.025).startswith(
        "Async pays ≥ 2.5% at batch_size ≥ 32 when gen_len ≤ 1024, "
        "and at batch_size ≥ 8 when gen_len ≥ 32768"
    )
    assert verdict(comp, keys, 2.0).startswith("Async does not pay ≥ 100% at any setting")
    assert range_words("b", [1, 8, 32, 128], [8, 32]) == "8 ≤ b ≤ 32"
    assert range_words("b", [1, 8, 32, 128], [1, 8]) == "b ≤ 8"
    assert range_words("b", [1, 8, 32, 128], [8]) == "b = 8"
    assert range_words("b", [1, 8, 32, 128], [1, 32]) == "b in 1, 32"


def test_bands_are_drawn_where_the_sweep_has_them():
    comp = comp_table().assign(speedup_p5=lambda d: d.speedup - 0.02)
    comp = comp.assign(speedup_p95=lambda d: d.speedup + 0.02)
    fig = lines_figure(comp, "workload.batch_size", "workload.gen_len", 1.05)
    bands = [t for t in fig.data if t.fill == "tonexty"]
    assert len(bands) == 2 and all(t.xaxis == "x" for t in bands)
    plain = lines_figure(comp_table(), "workload.batch_size", "workload.gen_len", 1.05)
    assert not [t for t in plain.data if t.fill == "tonexty"]
    assert "band spans the threshold" in verdict(comp, ["workload.batch_size"], 1.05)


def test_the_page_promises_no_job_reports_that_are_not_there(tmp_path):
    sweep = make_sweep(tmp_path / "sw", SWEEP)
    html = write_summary(sweep).html.read_text()
    assert "report.html" not in html
    assert "Async pays ≥ 5% at" in html
