"""Bad input and interrupted work, through the command line as a user meets them: every bad
value is one line and exit 2 before any directory exists; an interrupt is one line and 130/143
with nothing partial under a final name; a run directory is one run's, a sweep directory one
sweep's; a sweep killed at any point resumes to the summary of an uninterrupted one."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import make_config, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from cbsim.config import ConfigError
from cbsim.rundir import FINISHED_FILE, LOCK_FILE, read_finished
from cbsim.sweep.summary import FINISHED, collect_jobs
from cbsim.trace import read_trace

TINY = ["model=tiny", "workload.batch_size=2", "workload.gen_len=8"]
# a simulation that runs for many seconds: requests keep arriving, so no step repeats the last
LONG = [
    "workload.batch_size=64",
    "workload.num_requests=20000",
    "workload.arrival=poisson",
    "workload.rate=2000",
    "workload.prompt_dist=uniform",
    "workload.prompt_spread=0.5",
    "workload.gen_len=256",
    "workload.gen_dist=uniform",
    "workload.gen_spread=0.5",
    # its trace would be past what cbsim reads back (cbsim.sizing): it is interrupted first
    "limits.max_trace_mb=100000",
]


def one_line_error(r: subprocess.CompletedProcess, fragment: str) -> str:
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith("cbsim: config error: ") and "; allowed:" in lines[0]
    assert fragment in lines[0]
    return lines[0]


# The table, a row each: the exact input and what the message must name.
ROWS = [
    (["hardware.gpu.forward_fixed_us=-1000000"], "hardware.gpu.forward_fixed_us=-1000000"),
    (["hardware.copy_latency_us=nan"], "hardware.copy_latency_us=nan"),
    (["hardware.host.prepare.fixed_us=nan"], "hardware.host.prepare.fixed_us=nan"),
    (["hardware.gpu.graph_node_gap_us=nan"], "hardware.gpu.graph_node_gap_us=nan"),
    (["hardware.gpu.carry_over_us=-50"], "hardware.gpu.carry_over_us=-50"),
    (["workload.prompt_spread=nan"], "workload.prompt_spread=nan"),
    (["hardware.hbm_bandwidth=inf"], "hardware.hbm_bandwidth=inf"),
    (["workload.prompt_file=/no/such/file"], "workload.prompt_dist=fixed"),
    (["workload.prompt_dist=file", "workload.prompt_file=/no/such/file"], "/no/such/file"),
    (["workload.prompt_dist=file", "workload.prompt_file=TEXT"], "workload.prompt_file="),
    (["+extra.holdot=1"], "extra.holdot=1"),
    (["workload.batch_size=abc"], "workload.batch_size=abc"),
    (["workload.batchsize=3"], "workload.batchsize"),
    (["engine=turbo"], "engine=turbo"),
]


@pytest.mark.parametrize("overrides,fragment", ROWS)
def test_a_bad_value_is_one_line_and_exit_2_before_any_directory(tmp_path, overrides, fragment):
    text = tmp_path / "lengths.txt"
    text.write_text("12\nlong\n")
    overrides = [o.replace("TEXT", str(text)) for o in overrides]
    run_dir = tmp_path / "run"
    r = run_cli([*TINY, *overrides, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    one_line_error(r, fragment)
    assert "Traceback" not in r.stderr
    assert not run_dir.exists(), "nothing may be created for a config that cannot run"


def test_a_typo_under_extra_of_a_validation_task_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli(["+experiment=validate", "+extra.holdot=loo", f"hydra.run.dir={run_dir}"], tmp_path)
    line = one_line_error(r, "extra.holdot=loo is not a setting of task=validate")
    assert "holdout" in line
    assert not run_dir.exists()
    # without the +, Hydra refuses the new key itself: the message still lists the task's keys
    r = run_cli(["+experiment=validate", "extra.holdot=loo", f"hydra.run.dir={run_dir}"], tmp_path)
    line = one_line_error(r, "extra.holdot is not a key here; allowed: anchor, anchor_host, bands")
    assert "holdout" in line and "?" not in line
    assert not run_dir.exists()


def test_a_sweep_with_one_bad_job_runs_none(tmp_path):
    sweep = tmp_path / "sweep"
    r = run_cli(
        ["-m", *TINY, "hardware.gpu.carry_over_us=3,-50", f"hydra.sweep.dir={sweep}"], tmp_path
    )
    line = one_line_error(r, "hardware.gpu.carry_over_us=-50")
    assert "in the sweep's job" in line
    assert not sweep.exists()


def _numeric_fields():
    """(dotted key, dataclass field) for every int and float field of the schema."""
    import dataclasses
    import typing

    from cbsim.config.schema import CbsimConfig

    out = []

    def walk(schema, prefix):
        hints = typing.get_type_hints(schema)
        for f in dataclasses.fields(schema):
            t = hints[f.name]
            if dataclasses.is_dataclass(t):
                walk(t, f"{prefix}{f.name}.")
            elif t in (int, float):
                out.append((f"{prefix}{f.name}", t))

    walk(CbsimConfig, "")
    return out


NUMERIC = _numeric_fields()


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from(NUMERIC),
    st.one_of(
        st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 0.0, 1e30]),
        st.floats(-1e9, 1e9, allow_nan=False),
    ),
)
def test_any_number_is_accepted_finite_or_refused_naming_its_key(field, value):
    key, kind = field
    text = repr(int(value)) if kind is int and math.isfinite(value) else repr(value)
    try:
        cfg = make_config([f"{key}={text}"])
    except ConfigError as exc:
        assert key.split(".")[-1] in str(exc) and "allowed" in str(exc)
        return
    except Exception as exc:  # a type Hydra refuses while composing (inf for an int)
        assert key.split(".")[-1] in str(exc) + str(exc.__cause__)
        return
    got = cfg
    for part in key.split("."):
        got = getattr(got, part)
    assert math.isfinite(got)


# --- interrupts and run directories ---


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cbsim", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_run_says_so_in_one_line_and_leaves_nothing_final(tmp_path, sig, code):
    run_dir = tmp_path / "run"
    proc = _start([*LONG, "engine=compare", f"hydra.run.dir={run_dir}"], tmp_path)
    _wait_for(run_dir / LOCK_FILE, proc)
    time.sleep(3.0)  # inside the simulation (setting up 20,000 requests takes a second or two)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-2000:]
    assert "Traceback" not in err
    # the run's estimate first (it is a long one), then the interrupt
    estimate, line = [ln for ln in err.splitlines() if ln.startswith("cbsim:")]
    assert estimate.startswith("cbsim: estimate: about ")
    assert line.startswith(f"cbsim: interrupted by {sig.name}:") and "not finished" in line
    names = {p.name for p in run_dir.iterdir()}
    assert not {n for n in names if n.startswith("trace") and "_partial" not in n}
    assert FINISHED_FILE not in names and "metrics.json" not in names
    # the simulation so far, kept under its partial name and read back as incomplete
    (partial,) = [n for n in names if n.startswith("trace_") and "_partial" in n]
    assert partial in line and read_trace(run_dir / partial).incomplete
    assert not [n for n in names if n.endswith(".tmp")]


@pytest.mark.slow
def test_a_second_run_into_a_busy_directory_fails_and_the_first_finishes_alone(tmp_path):
    run_dir = tmp_path / "run"
    first = _start([*LONG, f"hydra.run.dir={run_dir}"], tmp_path)
    _wait_for(run_dir / LOCK_FILE, first)
    time.sleep(0.5)
    hydra_config = (run_dir / ".hydra" / "config.yaml").read_text()
    second = run_cli([*TINY, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert second.returncode == 2, second.stderr[-2000:]
    (line,) = second.stderr.strip().splitlines()
    assert "is in use by another run" in line and str(run_dir) in line
    # refused before Hydra wrote the second run's config over the first one's
    assert (run_dir / ".hydra" / "config.yaml").read_text() == hydra_config
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=120)
    assert first.returncode == 143
    assert not (run_dir / "metrics.json").exists(), "the second run wrote nothing there"


@pytest.mark.slow
def test_a_different_run_in_a_used_directory_replaces_all_of_the_earlier_one(tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli([*TINY, "engine=compare", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (run_dir / "trace_sync.json.gz").is_file() and (
        run_dir / "trace_async.json.gz"
    ).is_file()
    r = run_cli(
        [*TINY, "engine=async", "output.report=false", f"hydra.run.dir={run_dir}"], tmp_path
    )
    assert r.returncode == 0, r.stderr[-2000:]
    names = {p.name for p in run_dir.iterdir() if not p.name.startswith(".")}
    assert names == {"cbsim.log", "trace.json.gz", "metrics.json", "job_config.json", FINISHED_FILE}
    marker = read_finished(run_dir)
    assert marker is not None and set(marker["files"]) == names - {"cbsim.log", FINISHED_FILE}
    assert (
        "already finished"
        in run_cli(
            [*TINY, "engine=async", "output.report=false", f"hydra.run.dir={run_dir}"], tmp_path
        ).stdout
    )


@pytest.mark.slow
def test_a_run_that_cannot_fit_the_device_says_so_in_metrics_and_summary(tmp_path):
    sweep = tmp_path / "sweep"
    r = run_cli(
        ["-m", *TINY, "hardware.memory_bytes=1e3,1e12", f"hydra.sweep.dir={sweep}"], tmp_path
    )
    assert r.returncode == 0, r.stderr[-2000:]
    summary = pd.read_csv(sweep / "summary.csv").set_index("hardware.memory_bytes")
    assert not summary.loc[1e3, "fits_device"] and summary.loc[1e12, "fits_device"]
    small = json.loads((sweep / "0" / "metrics.json").read_text())
    assert small["fits_device"] is False
    assert small["device_bytes_needed"] > small["device_bytes_available"] == 1e3


def test_a_rerun_that_fails_leaves_no_stale_metrics_of_the_old_config(tmp_path):
    # a job directory run again with another config whose run fails keeps nothing that reads
    # as finished: the summary must not list the old config's metrics under the new overrides
    run_dir = tmp_path / "job"
    common = [
        "model=tiny",
        "workload.batch_size=2",
        "output.report=false",
        f"hydra.run.dir={run_dir}",
    ]
    ok = run_cli([*common, "workload.gen_len=4"], cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert (run_dir / "metrics.json").is_file()
    # the same directory, another config whose run fails (a drawn prompt over the budget)
    bad = run_cli(
        [
            *common,
            "workload.gen_len=8",
            "workload.prompt_dist=lognormal",
            "workload.prompt_spread=1.0",
            "workload.chunked_prefill=false",
            "workload.max_batch_tokens=300",
        ],
        cwd=tmp_path,
    )
    assert bad.returncode != 0
    (job,) = collect_jobs(tmp_path)
    assert "workload.gen_len=8" in job.overrides
    assert job.status != FINISHED


@pytest.mark.slow
def test_a_sweep_directory_reused_for_another_sweep_is_refused(tmp_path):
    sweep = tmp_path / "sweep"
    tiny = ["model=tiny", "workload.gen_len=8"]
    first = ["-m", *tiny, "workload.batch_size=2,4", f"hydra.sweep.dir={sweep}"]
    r = run_cli(first, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    before = (sweep / "summary.csv").read_text()
    r = run_cli(["-m", *tiny, "workload.batch_size=2", f"hydra.sweep.dir={sweep}"], tmp_path)
    line = one_line_error(r, f"hydra.sweep.dir={sweep} holds another sweep")
    assert "workload.batch_size=2,4" in line and "workload.batch_size=2" in line
    assert (sweep / "summary.csv").read_text() == before, "the first sweep's files untouched"
    assert run_cli(first, tmp_path).returncode == 0, "the same sweep again resumes"


# --- sweeps killed at random points ---

SWEEP = [
    "-m",
    "model=tiny",
    "engine=sync,async",
    "workload.batch_size=2,8",
    "workload.gen_len=256,512",
    "hydra/launcher=parallel",
    "hydra.launcher.n_jobs=2",
]


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids: list[int], timeout: float = 30) -> list[int]:
    end = time.monotonic() + timeout
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


@pytest.mark.slow
def test_killing_the_sweeps_main_process_ends_its_workers(tmp_path):
    pytest.importorskip("joblib")
    long_jobs = [a.replace("256,512", "3000") for a in SWEEP]
    proc = _start([*long_jobs, f"hydra.sweep.dir={tmp_path / 's'}"], tmp_path)
    end = time.monotonic() + 120
    while len(_children(proc.pid)) < 2:
        assert proc.poll() is None and time.monotonic() < end, proc.communicate()[1][-2000:]
        time.sleep(0.1)
    time.sleep(0.5)
    workers = _children(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    # the workers hold the sweep's output pipes: this returns only once they are gone too
    proc.communicate(timeout=60)
    assert _wait_gone(workers) == [], "workers outlived the sweep's main process"


@pytest.mark.slow
def test_a_sweep_killed_at_random_points_resumes_to_the_uninterrupted_summary(tmp_path):
    pytest.importorskip("joblib")
    ref = tmp_path / "ref"
    r = run_cli([*SWEEP, f"hydra.sweep.dir={ref}"], tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    sweep, rng = tmp_path / "sweep", random.Random(13)
    for attempt in range(3):
        proc = _start([*SWEEP, f"hydra.sweep.dir={sweep}"], tmp_path)
        time.sleep(rng.uniform(1.5, 6.0))
        victims = [proc.pid, *_children(proc.pid)] if attempt % 2 == 0 else _children(proc.pid)
        for pid in victims:  # the main process and its workers, or the workers only
            os.kill(pid, signal.SIGKILL)
        proc.communicate(timeout=60)
        _wait_gone(victims)
    r = run_cli([*SWEEP, f"hydra.sweep.dir={sweep}"], tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got, want = (pd.read_csv(d / "summary.csv") for d in (sweep, ref))
    pd.testing.assert_frame_equal(got, want)
    assert (got["status"] == "finished").all() and len(got) == 8
    assert not list(sweep.glob("**/.*.tmp")), "no half-written file left under any name"
