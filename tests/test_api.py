"""The Python API: a notebook user's run, sweep and traces without Hydra's command line."""

from __future__ import annotations

import re
import subprocess
import sys

import pandas as pd
import pytest
from conftest import REPO
from test_sweep import SWEEP, make_sweep

import cbsim
from cbsim.config import ConfigError
from cbsim.metrics import compute_metrics
from cbsim.trace import write_trace

SMALL = ("model=tiny", "workload.batch_size=4", "workload.prompt_len=32", "workload.gen_len=24")


@pytest.fixture(scope="module")
def result():
    return cbsim.simulate("+experiment=long_seq", "engine=async", *SMALL)


def test_simulate_returns_metrics_steps_and_spans(result):
    m = result.metrics["async"]
    assert set(result.metrics) <= {"async", "bands"}
    assert m["total_time_s"] == pytest.approx(
        compute_metrics(result.traces["async"])["total_time_s"]
    )
    assert m["fits_device"] is True
    assert m["hbm_tbps_mean"] > 0  # the run config travels with the trace
    assert result.traces["async"].other_data["config"]["workload"]["gen_len"] == 24
    assert isinstance(result.steps, pd.DataFrame) and isinstance(result.spans, pd.DataFrame)
    assert len(result.steps) == m["steps"] > 0
    assert {"engine", "step", "step_ms", "gpu_ms", "exposed_ms"} <= set(result.steps.columns)
    assert {"engine", "lane", "name", "ts_ms", "end_ms", "dur_ms", "step"} <= set(
        result.spans.columns
    )
    assert not [c for c in result.spans.columns if c.endswith("_us")]  # one unit: ms
    spans = result.spans
    assert (spans["end_ms"] - spans["ts_ms"] - spans["dur_ms"]).abs().max() < 1e-9
    assert (result.spans["engine"] == "async").all()
    # the step table sums to the run: the last step ends at the run's GPU end
    assert result.steps["step_ms"].sum() == pytest.approx(result.steps["end_ms"].iloc[-1])


@pytest.fixture(scope="module")
def compared():
    return cbsim.simulate("engine=compare", *SMALL)


def test_compare_gives_both_engines_and_the_comparison(compared):
    r = compared
    # bands: mode.bands=auto draws them for a single run of a profile with a spread (h200)
    assert set(r.metrics) == {"sync", "async", "comparison", "bands"}
    assert r.metrics["comparison"]["speedup"] == pytest.approx(
        r.metrics["sync"]["total_time_s"] / r.metrics["async"]["total_time_s"]
    )
    assert set(r.steps["engine"]) == {"sync", "async"}


def test_one_engine_and_two_give_metrics_of_one_shape(result, compared):
    """The README's notebook lines read the same keys whether one engine ran or both."""
    for r in (result, compared):
        assert r.metrics["async"]["gpu_idle_fraction"] >= 0
        assert set(r.engine_metrics()) == set(r.traces)
    assert "comparison" not in result.metrics


def test_a_result_prints_as_one_short_line_and_a_small_html_table(compared):
    text = repr(compared)
    assert len(text) <= 120 and "\n" not in text
    total = compared.metrics["sync"]["total_time_s"]
    assert text.startswith("Result(sync ") and f"{total:.4g} s" in text
    assert f"x{compared.metrics['comparison']['speedup']:.3f}" in text
    html = compared._repr_html_()
    assert html.count("<tr") < 20 and "GPU idle" in html and len(html) < 5000
    idle = compared.metrics["async"]["gpu_idle_fraction"]
    assert f"<td>{idle:.2%}</td>" in html
    assert "<th>sync</th>" in html and "<th>async</th>" in html


def test_table_has_one_row_per_engine_and_the_metrics_as_columns(compared):
    table = compared.table()
    assert list(table.index) == ["sync", "async"] and table.index.name == "engine"
    assert table.loc["async", "total_time_s"] == compared.metrics["async"]["total_time_s"]
    assert table.columns[0] == "total_time_s"
    assert all(not isinstance(v, dict) for v in table.iloc[0])


def test_write_trace_gives_a_file_that_loads_back_as_the_same_runs(compared, result, tmp_path):
    from conftest import assert_nests

    path = compared.write_trace(tmp_path / "both.json.gz")
    back = cbsim.load_traces(path)
    assert list(back.traces) == ["sync", "async"]
    assert_nests(path)
    for e in ("sync", "async"):
        assert back.metrics[e]["total_time_s"] == pytest.approx(compared.metrics[e]["total_time_s"])
    one = cbsim.load_traces(result.write_trace(tmp_path / "one.json"))
    assert list(one.traces) == ["async"]


def test_report_writes_the_run_report(result, tmp_path):
    path = result.report(tmp_path / "r.html")
    html = path.read_text()
    assert html.startswith("<!DOCTYPE html>") and "Timeline" in html


def test_bad_overrides_raise_the_cli_message():
    with pytest.raises(ConfigError, match="workload.batch_size"):
        cbsim.simulate("workload.batch_size=0")
    with pytest.raises(ConfigError, match="engine=fast is not an option; allowed: "):
        cbsim.simulate("engine=fast")
    with pytest.raises(ConfigError, match="mode=sim"):
        cbsim.simulate("mode=runtime")


def test_load_sweep_and_load_traces(tmp_path, result):
    sweep = make_sweep(tmp_path / "sw", SWEEP)
    summary = cbsim.load_sweep(sweep)
    assert len(summary) == 16 and {"status", "total_time_s", "engine"} <= set(summary.columns)
    assert (sweep / "summary.csv").is_file()  # written from the job dirs when missing
    with pytest.raises(FileNotFoundError, match="no such sweep directory"):
        cbsim.load_sweep(tmp_path / "nope")
    path = write_trace(result.traces["async"], tmp_path / "t.json.gz")
    loaded = cbsim.load_traces(path)
    assert loaded.metrics["async"]["total_time_s"] == pytest.approx(
        result.metrics["async"]["total_time_s"]
    )
    assert loaded.report(tmp_path / "t.html").is_file()


def test_the_package_is_typed_and_imports_its_api_lazily():
    assert (REPO / "cbsim" / "py.typed").is_file()
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^"cbsim" = \[[^\]]*"py\.typed"', pyproject, re.M)  # package data
    code = "import sys, cbsim.trace; print('cbsim.api' in sys.modules, 'plotly' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_simulate_measures_what_the_command_line_measures(result, tmp_path):
    import json

    from conftest import run_cli

    args = ["+experiment=long_seq", "engine=async", *SMALL, f"hydra.run.dir={tmp_path / 'r'}"]
    r = run_cli(args, cwd=tmp_path, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    cli = json.loads((tmp_path / "r" / "metrics.json").read_text())
    for key in ("total_time_s", "gpu_idle_fraction", "hbm_tbps_mean", "steps", "median_ttft_ms"):
        assert result.metrics["async"][key] == pytest.approx(cli[key]), key
