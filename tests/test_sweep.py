"""The sweep summary: job discovery, pairing, summary.csv/sweep.html, and resume through the CLI."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import run_cli
from synthetic_trace import cost_model, loop_trace

from cbsim.metrics import compare_metrics, compute_metrics
from cbsim.rundir import write_finished
from cbsim.sweep import collect_jobs, comparison_frame, write_summary
from cbsim.sweep.__main__ import main as sweep_main
from cbsim.sweep.report import crossovers, pick_axes
from cbsim.sweep.summary import FINISHED, NOT_FINISHED, NOT_STARTED, flatten

SWEEP = ["engine=sync,async", "workload.batch_size=1,8,32,128", "workload.gen_len=1024,32768"]


def fake_metrics(engine: str, batch_size: int, gen_len: int) -> dict:
    cpu, gpu = cost_model(batch_size, gen_len)
    if engine == "compare":
        s, a = (compute_metrics(loop_trace(e, 20, batch_size, cpu, gpu)) for e in ("sync", "async"))
        return {"sync": s, "async": a, "comparison": compare_metrics(s, a)}
    return {"engine": engine, **compute_metrics(loop_trace(engine, 20, batch_size, cpu, gpu))}


def make_sweep(
    root: Path, task: list[str], skip: set[int] = frozenset(), unfinished: set[int] = frozenset()
) -> Path:
    """A sweep dir as Hydra + cbsim.app leave it: multirun.yaml, job dirs, metrics.json."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    root.mkdir(parents=True, exist_ok=True)
    (root / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": {"task": task}}}))
    jobs = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(task), None)[0]
    for num, overrides in enumerate(jobs):
        if num in skip:
            continue
        job = root / str(num)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
        (job / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"num": num}}}))
        if num in unfinished:
            continue
        ov = dict(o.split("=", 1) for o in overrides)
        m = fake_metrics(ov["engine"], int(ov["workload.batch_size"]), int(ov["workload.gen_len"]))
        (job / "metrics.json").write_text(json.dumps(m))
        write_finished(job, {"job": num}, ["metrics.json"])
    return root


def test_summary_lists_every_job_and_pairs_the_engines(tmp_path):
    sweep = make_sweep(tmp_path / "sw", SWEEP, skip={15}, unfinished={3})
    result = write_summary(sweep)
    summary = pd.read_csv(result.summary)
    assert len(summary) == 16
    assert list(summary.columns[:7]) == [
        "job",
        "status",
        "dir",
        "overrides",
        "engine",
        "workload.batch_size",
        "workload.gen_len",
    ]
    status = dict(zip(summary["job"], summary["status"]))
    assert status[3] == NOT_FINISHED and status[15] == NOT_STARTED
    assert sum(s == FINISHED for s in status.values()) == 14
    assert summary.loc[summary.job == 3, "total_time_s"].isna().all()
    assert "lane_busy.compute" in summary.columns  # nested metrics are flattened
    comp = pd.read_csv(result.comparison)
    # 8 settings; job 3 (sync, 8, 32768) and job 15 (async, 128, 32768) leave two without a pair
    assert len(comp) == 6
    row = comp[(comp["workload.batch_size"] == 32) & (comp["workload.gen_len"] == 1024)].iloc[0]
    sync = summary[
        (summary.engine == "sync")
        & (summary["workload.batch_size"] == 32)
        & (summary["workload.gen_len"] == 1024)
    ].iloc[0]
    asyn = summary[
        (summary.engine == "async")
        & (summary["workload.batch_size"] == 32)
        & (summary["workload.gen_len"] == 1024)
    ].iloc[0]
    assert row["speedup"] == pytest.approx(sync["total_time_s"] / asyn["total_time_s"])
    assert row["gpu_idle_sync"] == pytest.approx(sync["gpu_idle_fraction"])
    html = result.html.read_text()
    assert "Not finished: 2" in html and "cbsim sweep: 14 of 16 jobs finished" in html
    assert "async speedup" in html


def test_compare_jobs_are_pairs_by_themselves(tmp_path):
    sweep = make_sweep(
        tmp_path / "sw", ["engine=compare", "workload.batch_size=1,128", "workload.gen_len=1024"]
    )
    jobs = collect_jobs(sweep)
    comp = comparison_frame(jobs)
    assert len(comp) == 2
    for job, row in zip(jobs, comp.to_dict("records")):
        assert row["speedup"] == pytest.approx(job.metrics["comparison"]["speedup"])
    summary = pd.read_csv(write_summary(sweep, html=False).summary)
    assert "sync.total_time_s" in summary and "comparison.speedup" in summary


def test_job_dirs_without_multirun_yaml_and_odd_files(tmp_path):
    sweep = make_sweep(
        tmp_path / "sw", ["engine=sync,async", "workload.batch_size=8", "workload.gen_len=1024"]
    )
    (sweep / "multirun.yaml").unlink()
    (sweep / "1" / "metrics.json").write_text("{not json")
    jobs = collect_jobs(sweep)
    assert [j.status for j in jobs] == [FINISHED, NOT_FINISHED]
    assert comparison_frame(jobs).empty
    html = write_summary(sweep).html.read_text()
    assert "No setting has both engines finished yet" in html


def test_flatten_and_axes_and_crossovers():
    assert flatten({"a": 1, "b": {"c": 2, "d": [1, 2]}}) == {"a": 1, "b.c": 2, "b.d": "[1, 2]"}
    comp = pd.DataFrame(
        {
            "workload.gen_len": [1, 2, 1, 2],
            "workload.batch_size": [1, 1, 8, 8],
            "seed": [0, 0, 0, 0],
            "speedup": [1.0] * 4,
        }
    )
    assert pick_axes(comp, ["workload.gen_len", "workload.batch_size", "seed"]) == (
        "workload.batch_size",
        "workload.gen_len",
        [],
    )
    # log-interpolated in x: 1.0 at 8, 1.1 at 32 -> 1.05 at 16
    assert crossovers([8, 32], [1.0, 1.1], 1.05) == [pytest.approx(16.0)]
    assert crossovers([1, 8, 32], [1.2, 1.1, 1.06], 1.05) == []
    assert crossovers([1, 8], [math.nan, 1.0], 1.05) == []


def test_a_sweep_directory_holds_one_sweep(tmp_path, capsys):
    from cbsim.sweep.callback import claim_sweep_dir

    claim_sweep_dir(tmp_path, ["engine=sync,async", "workload.batch_size=1,8"], 4)
    claim_sweep_dir(tmp_path, ["engine=sync,async", "workload.batch_size=1,8"], 4)  # resume
    with pytest.raises(SystemExit) as exit_:
        claim_sweep_dir(tmp_path, ["engine=sync,async", "workload.batch_size=8"], 2)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("cbsim: config error: hydra.sweep.dir=")
    assert "only in it: workload.batch_size=1,8" in err
    assert "only in this one: workload.batch_size=8" in err


def test_job_hooks_move_the_bar_only_in_sweeps(tmp_path):
    from omegaconf import OmegaConf

    from cbsim.sweep import SweepSummary, progress

    cb = SweepSummary()
    hydra = {"job": {"num": 2}, "overrides": {"task": []}, "sweep": {"dir": str(tmp_path)}}
    progress.open_bar(3)
    try:
        cb.on_job_end(OmegaConf.create({"hydra": {**hydra, "mode": "RUN"}}), None)
        assert progress._bar.n == 0  # a single run is no job of a sweep
        cb.on_job_end(OmegaConf.create({"hydra": {**hydra, "mode": "MULTIRUN"}}), None)
        assert progress._bar.n == 1
    finally:
        progress.close_bar()


@pytest.mark.parametrize(
    "job",
    [
        ["engine=sync", "workload.batch_size=8", "workload.gen_len=1024"],
        ["engine=async", "workload.batch_size=256", "hardware.gpu.carry_over_us=5.5"],
        ["model=tiny", "workload.prompt_dist=uniform", "workload.prompt_spread=0.25"],
        ["+experiment=seed", "workload.batch_size=4"],  # a group added: Hydra's full path
    ],
)
def test_a_job_composed_from_the_cached_defaults_equals_hydras_own(job):
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from cbsim.sweep.compose import JobComposer

    with initialize_config_module(config_module="cbsim.conf", version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration("config", ["hydra.sweep.dir=/tmp/x"], RunMode.MULTIRUN)
        composer = JobComposer(master)
        composer.compose(["engine=sync", "workload.batch_size=1"])  # the defaults get cached
        fast, full = composer.compose(job), composer.full(job)
    assert OmegaConf.to_container(fast) == OmegaConf.to_container(full)
    assert list(fast.hydra.overrides.task) == job


@pytest.mark.slow
def test_metrics_without_a_trace_are_the_traced_ones(tmp_path):
    """A sweep's job simulates without building a trace; its metrics.json must hold the numbers
    a traced run computes from its trace."""
    common = [
        "model=tiny",
        "engine=compare",
        "workload.batch_size=4",
        "workload.gen_len=64",
        "workload.arrival=poisson",
        "workload.num_requests=12",
        "output.report=false",
    ]
    got = {}
    for trace in ("true", "false"):
        run_dir = tmp_path / trace
        r = run_cli([*common, f"output.trace={trace}", f"hydra.run.dir={run_dir}"], tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        got[trace] = flatten(json.loads((run_dir / "metrics.json").read_text()))
    assert not list((tmp_path / "false").glob("trace*"))
    assert set(got["true"]) == set(got["false"])
    for key, value in got["true"].items():
        if isinstance(value, float):
            assert got["false"][key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
        else:
            assert got["false"][key] == value, key


@pytest.mark.slow
def test_the_grid_sweep_writes_the_multiruns_summary(tmp_path):
    """python -m cbsim.sweep.grid: the same points, order and numbers as python -m cbsim -m."""
    from cbsim.sweep.grid import main as grid_main

    grid = [
        "model=tiny",
        "engine=sync,async",
        "workload.batch_size=2,8",
        "workload.gen_len=16,48",
        "hardware.gpu.carry_over_us=3,9.5",
    ]
    _multirun(tmp_path / "hydra", tmp_path, jobs=grid)
    assert grid_main([str(tmp_path / "grid"), *grid, "--no-html"]) == 0
    want, got = (pd.read_csv(tmp_path / d / "summary.csv") for d in ("hydra", "grid"))
    assert len(got) == 16 and (got["status"] == FINISHED).all()
    pd.testing.assert_frame_equal(got.drop(columns="dir"), want.drop(columns="dir"), rtol=1e-9)
    assert len(pd.read_csv(tmp_path / "grid" / "comparison.csv")) == 8


def test_a_bad_grid_point_is_one_line_and_nothing_written(tmp_path, capsys):
    from cbsim.sweep.grid import main as grid_main

    out = tmp_path / "grid"
    assert grid_main([str(out), "model=tiny", "workload.batch_size=2,0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cbsim: config error: workload.batch_size=0 is out of range; allowed:")
    assert "in the grid's point" in err and not out.exists()


def test_rebuild_from_the_command_line(tmp_path, capsys):
    sweep = make_sweep(
        tmp_path / "sw", ["engine=sync,async", "workload.batch_size=8", "workload.gen_len=1024"]
    )
    assert sweep_main([str(sweep), "--min-speedup", "1.5"]) == 0
    out = capsys.readouterr().out
    assert "2/2 jobs finished" in out
    assert out.strip().splitlines()[-1].startswith("Async pays ≥ 50% at every"), out
    assert "pays above x1.5" in (sweep / "sweep.html").read_text()
    assert sweep_main([str(tmp_path / "missing")]) == 2


# --- through Hydra: the callback, resume and launchers (the simulator runs tiny workloads) ---

SMALL = [
    "engine=sync,async",
    "workload.batch_size=4,8",
    "workload.gen_len=16",
    "output.print_table=false",
]


def _multirun(sweep: Path, tmp_path: Path, *extra: str, jobs: list[str] = SMALL):
    r = run_cli(["-m", *jobs, *extra, f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout + r.stderr


@pytest.mark.slow
def test_interrupted_sweep_resumes_and_summarises_every_job(tmp_path):
    sweep = tmp_path / "sweep"
    log = _multirun(sweep, tmp_path)
    assert "sweep: 4 jobs into" in log and "4/4 [" in log and "4/4 jobs finished" in log
    job_files = sorted(p.name for p in (sweep / "0").iterdir() if not p.name.startswith("."))
    assert job_files == ["cbsim.log", "finished.json", "job_config.json", "metrics.json"]
    assert "async speedup x" not in log, "no metrics table per job in a sweep's log"
    assert "Async pays" in log or "Async does not pay" in log, "the sweep ends with its verdict"
    first = pd.read_csv(sweep / "summary.csv")
    assert (first["status"] == FINISHED).all() and len(first) == 4
    kept = (sweep / "0" / "metrics.json").read_text()
    # job 2 stopped half-way: no metrics.json; the summary says so before the rerun
    (sweep / "2" / "metrics.json").unlink()
    interrupted = write_summary(sweep, html=False)
    assert [j.status for j in interrupted.jobs].count(NOT_FINISHED) == 1
    assert len(comparison_frame(interrupted.jobs)) == 1

    log = _multirun(sweep, tmp_path)
    assert log.count("skipped (resume)") == 3
    assert "(3 already finished there: skipped)" in log
    assert (sweep / "0" / "metrics.json").read_text() == kept
    again = pd.read_csv(sweep / "summary.csv")
    assert (again["status"] == FINISHED).all() and len(again) == 4
    assert len(pd.read_csv(sweep / "comparison.csv")) == 2
    assert (sweep / "sweep.html").is_file()


PLUGINS = {
    "parallel": "hydra_plugins.hydra_joblib_launcher",
    "slurm_local": "hydra_plugins.hydra_submitit_launcher",
    # in .venv-ray only (.ci/run): its cloudpickle < 3 pin clashes with joblib's >= 3
    "ray_local": "hydra_plugins.hydra_ray_launcher",
}


@pytest.mark.slow
@pytest.mark.parametrize("launcher", list(PLUGINS))
def test_launchers_run_the_sweep_and_the_summary(tmp_path, launcher):
    pytest.importorskip(PLUGINS[launcher], reason=f"hydra/launcher={launcher} needs its plugin")
    sweep = tmp_path / "sweep"
    extra = ["hydra.launcher.n_jobs=2"] if launcher == "parallel" else []
    pair = ["engine=sync,async", "workload.batch_size=4", "workload.gen_len=16"]
    # a job's report only when asked (a sweep's jobs write metrics.json by default)
    extra.append("output.report=true")
    log = _multirun(sweep, tmp_path, f"hydra/launcher={launcher}", *extra, jobs=pair)
    assert "2/2 jobs finished" in log
    summary = pd.read_csv(sweep / "summary.csv")
    assert (summary["status"] == FINISHED).all() and len(summary) == 2
    assert len(pd.read_csv(sweep / "comparison.csv")) == 1
    assert all((sweep / str(i) / "report.html").is_file() for i in range(2))


def test_help_describes_sweeps_and_reports(tmp_path):
    r = run_cli(["--help"], cwd=tmp_path, timeout=60)
    assert r.returncode == 0
    assert "summary.csv" in r.stdout and "hydra.sweep.dir" in r.stdout
    assert "engine: async, compare" in r.stdout.replace("engine_schema, ", "")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
