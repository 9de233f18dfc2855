"""Work sized before it starts: a run over this machine, or over a trace cbsim reads back, is
refused in one line naming the key, the estimate, the limit and the override, with nothing
written; what a run leaves is said when it is interrupted; a trace past 104 days is refused."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import make_config, run_cli

import cbsim
from cbsim.app import on_disk
from cbsim.config import ConfigError
from cbsim.config.hardware import HostRegimes
from cbsim.rundir import RunLock
from cbsim.sim import simulate
from cbsim.sim.host_speed import HostSpeed
from cbsim.sizing import (
    BYTES_PER_OUTPUT_TOKEN,
    REPORT_FIXED_BYTES,
    SIM_BYTES_PER_KV_BLOCK,
    check_size,
    estimate,
    request_bytes,
)
from cbsim.sweep.grid import run_grid
from cbsim.trace import TraceError, read_trace, write_trace

MILLION = "workload.num_requests=1000000"


def one_line(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if x.strip() and "UserWarning" not in x]
    lines = [x for x in lines if not x.lstrip().startswith("warnings.warn")]
    assert len(lines) == 1, stderr
    return lines[0]


def test_a_million_requests_is_refused_in_one_line_before_any_directory_exists(tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli([MILLION, f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=60)
    assert r.returncode == 2
    line = one_line(r.stderr)
    assert line.startswith("cbsim: config error: workload.num_requests=1000000: ")
    assert "events" in line and "limits.max_trace_mb=" in line and "output.trace=false" in line
    assert not run_dir.exists()


def test_without_a_trace_a_million_requests_fit_a_16_gb_machine_holding_no_token_id():
    """Issue #41: 1M requests of 256 + 1,024 tokens, 32M steps. The simulator keeps no token
    id (16 GB where it did): its steps' fold (4.8 GB) and a row a request (0.56 GB) and its KV
    blocks (1 GB). A smaller limit is refused naming the override."""
    quiet = [MILLION, "output.trace=false", "output.report=false"]
    est = check_size(make_config([*quiet, "limits.max_memory_gb=16"]))
    assert 5e9 < est.memory_bytes < 8e9
    with pytest.raises(ConfigError) as info:
        check_size(make_config([*quiet, "limits.max_memory_gb=4"]))
    message = str(info.value)
    assert message.startswith("workload.num_requests=1000000: about 32,0")
    assert "over limits.max_memory_gb=4" in message
    assert "limits.max_memory_gb=" in message.rsplit("allowed:", 1)[1]


def test_the_runtime_is_sized_with_its_token_ids_and_the_simulator_without():
    run = ["workload.num_requests=1000", "workload.prompt_len=256", "workload.gen_len=2048"]
    tokens = 1000 * (256 + 2048)
    assert request_bytes(make_config(run)) < 2 * tokens  # KV blocks: 13 bytes a 16 tokens
    runtime = request_bytes(make_config([*run, "mode=runtime", "model=tiny"]))
    assert runtime > 1000 * 2048 * BYTES_PER_OUTPUT_TOKEN


def test_without_a_trace_or_report_memory_grows_by_a_few_numbers_a_step():
    """A run that keeps no trace folds its spans: 4x the steps add ~150 bytes a step besides
    the KV blocks of the longer requests, where a run that builds its trace adds its events (2 KB
    each); its report, drawn from the fold and windows of steps, adds a few hundred bytes a step."""
    quiet = ["output.trace=false", "output.report=false"]
    lengths = (16384, 65536)
    short, long = (estimate(make_config([*quiet, f"workload.gen_len={n}"])) for n in lengths)
    steps = long.steps - short.steps
    assert steps > 40_000 and long.trace_bytes == 0
    blocks = 32 * (lengths[1] - lengths[0]) // 16 * SIM_BYTES_PER_KV_BLOCK  # 32 requests'
    assert 100 * steps < long.memory_bytes - short.memory_bytes - blocks < 400 * steps
    gen = f"workload.gen_len={lengths[1]}"
    traced = estimate(make_config(["output.trace=true", gen]))
    assert traced.memory_bytes - long.memory_bytes > 1000 * long.events
    assert traced.untraced_memory_bytes == long.memory_bytes
    windowed = estimate(make_config(["output.trace=false", "output.report=true", gen]))
    assert windowed.memory_bytes == traced.windowed_memory_bytes == long.windowed_memory_bytes
    grew = windowed.memory_bytes - long.memory_bytes - REPORT_FIXED_BYTES
    assert 0 < grew < 500 * long.steps < traced.memory_bytes - long.memory_bytes
    # both engines' folds wait for the page
    pair = estimate(make_config(["engine=compare", "output.trace=false", gen]))
    assert pair.memory_bytes - windowed.memory_bytes > 300 * long.steps


def test_a_run_over_memory_for_its_trace_is_told_that_without_one_it_fits():
    """output.trace=false keeps the report, drawn from windows of steps: the run fits; when
    even that is over the limit, without the report too."""
    run = ["workload.gen_len=65536", "limits.max_memory_gb=1"]
    with pytest.raises(ConfigError) as info:
        check_size(make_config(run))
    allowed = str(info.value).rsplit("allowed:", 1)[1]
    assert "output.trace=false (no trace kept, the report's timeline in windows of 6 " in allowed
    assert "limits.max_memory_gb=2 to run it anyway" in allowed
    assert check_size(make_config([*run, "output.trace=false"])).memory_bytes < 1e9
    tight = ["workload.gen_len=65536", "limits.max_memory_gb=0.22"]
    with pytest.raises(ConfigError) as info:
        check_size(make_config(tight))
    allowed = str(info.value).rsplit("allowed:", 1)[1]
    assert "output.trace=false output.report=false (no trace kept: " in allowed
    with pytest.raises(ConfigError):
        check_size(make_config([*tight, "output.trace=false"]))
    check_size(make_config([*tight, "output.trace=false", "output.report=false"]))


def test_a_tiny_poisson_rate_is_refused_naming_the_rate():
    config = make_config(["workload.arrival=poisson", "workload.rate=1e-12"])
    with pytest.raises(ConfigError, match=r"^workload.rate=1e-12: its 32 arrivals span .* s"):
        check_size(config)


def test_compare_with_a_trace_cbsim_could_not_read_back_is_refused_and_the_override_allows_it():
    over = ["engine=compare", "workload.gen_len=65536"]
    with pytest.raises(ConfigError, match=r"merged trace .* over what cbsim reads back"):
        check_size(make_config(over))
    est = check_size(make_config([*over, "limits.max_trace_mb=400"]))
    assert 256e6 < est.trace_bytes < 400e6
    assert check_size(make_config([*over, "output.trace=false"])).trace_bytes == 0


def test_a_runtime_on_the_cpu_is_checked_against_host_memory_before_it_starts(tmp_path):
    run_dir = tmp_path / "run"
    args = ["mode=runtime", "mode.device=cpu", "model=llama2_13b", "engine=sync"]
    r = run_cli([*args, f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=60)
    assert r.returncode == 2
    line = one_line(r.stderr)
    assert "model=llama2_13b" in line and "mode.device=cpu" in line
    assert "limits.max_memory_gb=" in line
    assert not run_dir.exists()


def test_a_memory_limit_set_low_refuses_the_default_run_and_a_high_one_lets_it_run():
    with pytest.raises(ConfigError, match=r"over limits.max_memory_gb=0.01; allowed"):
        check_size(make_config(["limits.max_memory_gb=0.01"]))
    assert check_size(make_config(["limits.max_memory_gb=100"])).memory_bytes < 1e9


@pytest.mark.parametrize(
    "overrides",
    [
        ["mode.bands=false"],
        ["mode.bands=false", "workload.num_requests=96", "workload.gen_len=256"],
        ["mode.bands=false", "workload.arrival=poisson", "workload.rate=2", "workload.gen_len=64"],
    ],
)
def test_the_step_estimate_is_within_a_fifth_of_the_simulators_count(overrides):
    config = make_config(overrides)
    steps = simulate(config, "async").counters["steps"]
    assert abs(estimate(config).steps - steps) <= 0.2 * steps


def test_the_api_and_the_grid_refuse_the_same_run(tmp_path):
    """Over 4 GB both ways: the API's run keeps its traces, the grid's folds them (6 GB)."""
    run = [MILLION, "limits.max_memory_gb=4"]
    with pytest.raises(ConfigError, match="workload.num_requests=1000000"):
        cbsim.simulate(*run)
    out = tmp_path / "grid"
    with pytest.raises(ConfigError, match="workload.num_requests=1000000: about"):
        run_grid(out, run)
    assert not out.exists()


def test_a_second_run_into_a_busy_directory_leaves_hydras_config_untouched(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    config_yaml = run_dir / ".hydra" / "config.yaml"
    config_yaml.write_text("the first run's config\n")
    with RunLock(run_dir):
        r = run_cli([f"hydra.run.dir={run_dir}", "model=tiny"], cwd=tmp_path, timeout=60)
    assert r.returncode == 2
    assert "is in use by another run" in one_line(r.stderr)
    assert config_yaml.read_text() == "the first run's config\n"


def test_an_interrupt_names_the_complete_traces_on_disk():
    exc = KeyboardInterrupt()
    assert on_disk(exc) == "no trace kept; not finished"
    exc.cbsim_written = [Path("d/trace_sync.json")]  # type: ignore[attr-defined]
    exc.cbsim_partial = Path("d/trace_async_partial.json")  # type: ignore[attr-defined]
    assert on_disk(exc) == (
        "complete trace in d/trace_sync.json; the trace so far is in "
        "d/trace_async_partial.json (incomplete); not finished"
    )


def test_a_trace_with_a_timestamp_past_104_days_is_refused_on_load(tmp_path):
    config = make_config(["model=tiny", "workload.gen_len=4", "workload.batch_size=2"])
    path = write_trace(simulate(config, "sync", want_trace=True).trace, tmp_path / "t.json")
    obj = json.loads(path.read_text())
    span = next(e for e in obj["traceEvents"] if e.get("ph") == "X")
    span["ts"] = 1e300
    path.write_text(json.dumps(obj))
    with pytest.raises(TraceError, match=r"ts=1e\+300 .* beyond .* \(104 days\)"):
        read_trace(path)


def test_a_band_draw_across_a_long_idle_gap_draws_a_few_stays_not_one_per_dwell():
    regimes = HostRegimes(slow_factor=2.2, fast_dwell_s=1.0, slow_dwell_s=0.6)
    speed = HostSpeed(regimes, realize=True, seed=3)
    start = time.perf_counter()
    levels = {speed.factor_at(t * 1e6) for t in (0.5, 1e7, 2e7, 9e12)}
    assert time.perf_counter() - start < 1.0  # was one stay per second of the gap: 10^13 stays
    assert len(speed._ends) < 100 and levels <= {1.0, 2.2}


def test_after_a_long_gap_the_level_is_slow_for_its_stationary_share():
    regimes = HostRegimes(slow_factor=2.2, fast_dwell_s=1.0, slow_dwell_s=0.6)
    slow = [HostSpeed(regimes, realize=True, seed=s).factor_at(1e12) > 1 for s in range(2000)]
    assert abs(sum(slow) / len(slow) - regimes.slow_share) < 0.04


def test_a_trace_found_past_the_limit_once_built_is_not_written_and_the_run_says_so(tmp_path):
    # lognormal lengths: the estimate (15,309 events, 4.3 MB) is under the limit, the trace
    # built (18,352 events, 5.1 MB) is not; the metrics are kept, the trace is not written
    run_dir = tmp_path / "run"
    args = ["engine=sync", "workload.batch_size=8", "workload.num_requests=64",
            "workload.gen_len=256", "workload.gen_dist=lognormal", "workload.gen_spread=0.8",
            "limits.max_trace_mb=4.7", "mode.bands=false", "output.report=false",
            f"hydra.run.dir={run_dir}"]  # fmt: skip
    r = run_cli(args, cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("cbsim:")]
    assert line.startswith("cbsim: sync trace not written: 18,")
    assert "limits.max_trace_mb=6 to write it" in line
    names = {p.name for p in run_dir.iterdir()}
    assert "metrics.json" in names and not [n for n in names if n.startswith("trace")]


def test_a_long_run_says_how_much_of_its_time_the_bands_take():
    run = ["workload.num_requests=100000", "output.trace=false"]
    with_bands, without = (estimate(make_config([*run, f"mode.bands={b}"])) for b in (True, False))
    assert with_bands.bands_s > 0.5 * with_bands.wall_s and without.bands_s == 0
    assert with_bands.wall_s - with_bands.bands_s == pytest.approx(without.wall_s)
    assert (
        "of it the bands' draws" in with_bands.describe()
        and "mode.bands=false" in with_bands.describe()
    )
    assert "bands" not in without.describe()
