"""Bands where the user sees them: metrics.json, the printed table, report.html, a sweep's summary
(mode.bands), and the finished marker and resume with them on. The simulator runs tiny workloads."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import make_config, run_cli

from cbsim.app import run_in
from cbsim.config import ConfigError
from cbsim.job_metrics import has_spread, wants_bands
from cbsim.rundir import METRICS_FILE, REPORT_FILE, finished_metrics
from cbsim.sweep.grid import run_grid

TINY = ["model=tiny", "workload.batch_size=4", "workload.gen_len=32", "engine=compare"]
QUIET = ["output.trace=false", "output.report=false", "output.print_table=false"]


def _run(run_dir: Path, overrides: list[str]) -> dict:
    """One single run through the app's run_in, as python -m cbsim runs it outside a sweep."""
    config = make_config([*TINY, *overrides])
    config.output = config.output.decided(False)
    resolved = json.loads(json.dumps(dataclasses.asdict(config), default=str))
    run_dir.mkdir(parents=True, exist_ok=True)  # Hydra makes it before the job runs
    run_in(run_dir, config, resolved)
    return json.loads((run_dir / METRICS_FILE).read_text())


def _ordered(band: dict) -> bool:
    return band["p5"] <= band["median"] <= band["p95"]


def test_a_run_writes_its_bands_into_metrics_json_and_the_table(tmp_path, capsys):
    metrics = _run(tmp_path / "a", [*QUIET, "output.print_table=true"])
    bands = metrics["bands"]
    assert bands["draws"] == make_config(TINY).hardware.host.spread.draws
    for engine in ("sync", "async"):
        assert _ordered(bands[engine]["total_time_s"]) and _ordered(
            bands[engine]["gpu_idle_fraction"]
        )
    assert _ordered(bands["speedup"])
    # the sync band has a width: the default profile's host spread moves a batch-4 run
    assert bands["sync"]["total_time_s"]["p95"] > bands["sync"]["total_time_s"]["p5"]
    out = capsys.readouterr().out
    *_, bands_line, why = out.splitlines()
    assert "band: P5 / median / P95 over" in out and "async speedup x" in bands_line
    assert why.startswith("Why: in sync, the host works"), "the table ends with the why"
    again = _run(tmp_path / "b", QUIET)
    assert again["bands"] == bands, "same seed, same bands"


def test_the_api_draws_the_command_lines_bands(tmp_path):
    import cbsim

    r = cbsim.simulate(*TINY)
    assert r.metrics["bands"] == _run(tmp_path / "app", QUIET)["bands"]
    assert "host-speed draws" in r.report(tmp_path / "r.html").read_text()
    assert "bands" not in cbsim.simulate(*TINY, "mode.bands=false").metrics


def test_bands_false_writes_none_and_auto_needs_a_spread(tmp_path):
    assert "bands" not in _run(tmp_path / "off", [*QUIET, "mode.bands=false"])
    flat = make_config(
        [
            "hardware.host.spread.between_calls=0",
            "hardware.host.spread.within_run=0",
            "hardware.host.regimes.slow_dwell_s=0",
            "hardware.gpu.spread.forward_error=0",
        ]
    )
    assert not has_spread(flat.hardware) and not wants_bands(flat, in_sweep=False)
    auto = make_config([])
    assert wants_bands(auto, in_sweep=False) and not wants_bands(auto, in_sweep=True)
    assert wants_bands(make_config(["mode.bands=true"]), in_sweep=True)
    assert not wants_bands(make_config(["mode=runtime"]), in_sweep=False)


def test_a_bad_bands_value_names_the_key_and_the_choices(tmp_path):
    with pytest.raises(ConfigError, match="mode.bands=true with mode=runtime.*allowed"):
        make_config(["mode=runtime", "mode.bands=true"])
    r = run_cli(["mode.bands=sometimes"], cwd=tmp_path, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "cbsim: config error: mode.bands=sometimes is not an option; allowed: auto, true, false"
    )


def test_the_report_holds_the_bands_and_the_run_resumes(tmp_path):
    run_dir = tmp_path / "r"
    overrides = ["output.trace=false", "output.report=true", "output.print_table=false"]
    metrics = _run(run_dir, overrides)
    html = (run_dir / REPORT_FILE).read_text()
    assert f"bands over {metrics['bands']['draws']} host-speed draws" in html
    speedup = metrics["bands"]["speedup"]
    assert f"<td>async speedup</td><td>x{speedup['p5']:.3f}</td>" in html
    # a finished run with bands is still finished: the second call skips it, files untouched
    resolved = json.loads((run_dir / "job_config.json").read_text())
    assert finished_metrics(run_dir, resolved) == metrics
    stamp = (run_dir / METRICS_FILE).stat().st_mtime_ns
    assert _run(run_dir, overrides) == metrics
    assert (run_dir / METRICS_FILE).stat().st_mtime_ns == stamp


def test_a_grid_sweep_carries_bands_only_when_asked(tmp_path):
    grid = ["model=tiny", "engine=sync,async", "workload.batch_size=2,8", "workload.gen_len=16"]
    run_grid(tmp_path / "auto", grid, html=False)
    assert "speedup_p5" not in pd.read_csv(tmp_path / "auto" / "comparison.csv")
    run_grid(tmp_path / "on", [*grid, "mode.bands=true"], html=True)
    comp = pd.read_csv(tmp_path / "on" / "comparison.csv")
    assert len(comp) == 2
    for stem in ("speedup", "gpu_idle_sync", "gpu_idle_async", "time_sync_s", "time_async_s"):
        assert (comp[f"{stem}_p5"] <= comp[f"{stem}_median"]).all(), stem
        assert (comp[f"{stem}_median"] <= comp[f"{stem}_p95"]).all(), stem
    summary = pd.read_csv(tmp_path / "on" / "summary.csv")
    assert summary["bands.speedup.median"].notna().all()
    cols = list(summary.columns)  # the bands after the lead metrics: speedup, sync, async
    order = ["fits_device", "bands.speedup.p5", "bands.speedup.p95", "bands.sync.total_time_s.p5"]
    assert [cols.index(c) for c in order] == sorted(cols.index(c) for c in order)
    assert "speedup P5-P95" in (tmp_path / "on" / "sweep.html").read_text()


@pytest.mark.slow
def test_a_hydra_sweep_with_bands_summarises_them_and_resumes(tmp_path):
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        "model=tiny",
        "engine=sync,async",
        "workload.batch_size=4",
        "workload.gen_len=16",
        "mode.bands=true",
        f"hydra.sweep.dir={sweep}",
    ]
    r = run_cli(args, cwd=tmp_path, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "bands" in json.loads((sweep / "0" / METRICS_FILE).read_text())
    comp = pd.read_csv(sweep / "comparison.csv")
    assert len(comp) == 1 and comp["speedup_p5"][0] <= comp["speedup_p95"][0]
    assert "speedup P5-P95" in (sweep / "sweep.html").read_text()
    stamps = [(sweep / str(i) / METRICS_FILE).stat().st_mtime_ns for i in (0, 1)]
    r = run_cli(args, cwd=tmp_path, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (r.stdout + r.stderr).count("skipped (resume)") == 2
    assert [(sweep / str(i) / METRICS_FILE).stat().st_mtime_ns for i in (0, 1)] == stamps
    assert pd.read_csv(sweep / "comparison.csv").equals(comp)
