"""+experiment=calibrate on a Kineto import of an engine not written here (transformers' own
continuous batching, tests/data/kineto_h200_transformers_cb.json.gz): the workload comes from the
command line (experiments/kineto/profile_transformers_cb.py: Llama-3.2-1B shape, 8 x (64 + 24),
sync batching), the profile is fitted to it and the async speedup predicted."""

from __future__ import annotations

import json

import pytest
from conftest import REPO, compose_cfg, load_config, run_cli

from cbsim.calibration.predict import import_check
from cbsim.calibration.recordings import load
from cbsim.config import ConfigError
from cbsim.trace import write_trace
from cbsim.trace.kineto import import_kineto
from cbsim.validation.tasks import run_validation_task

RAW = REPO / "tests" / "data" / "kineto_h200_transformers_cb.json.gz"
WORKLOAD = [
    "model=llama3_1b",
    "engine=sync",
    "workload.batch_size=8",
    "workload.prompt_len=64",
    "workload.gen_len=24",
]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    return write_trace(import_kineto(RAW), tmp_path_factory.mktemp("kineto") / "tcb.json.gz")


def test_an_import_needs_the_workload_from_the_command_line(imported, tmp_path):
    cfg = load_config(compose_cfg(["+experiment=calibrate", f"trace=[{imported}]", *WORKLOAD]))
    with pytest.raises(ConfigError, match="extra.workload_from_cli=true"):
        run_validation_task(cfg, {}, tmp_path)
    args = ["+experiment=calibrate", f"trace=[{imported}]", "extra.workload_from_cli=true"]
    cfg = load_config(compose_cfg([*args, "engine=compare"]))
    with pytest.raises(ConfigError, match="engine=sync or engine=async"):
        run_validation_task(cfg, {}, tmp_path)


def test_calibrate_a_kineto_import_and_predict_its_async_gain(imported, tmp_path):
    run_dir = tmp_path / "run"
    args = [
        "+experiment=calibrate",
        f"trace=[{imported}]",
        "extra.workload_from_cli=true",
        "extra.profile=h200_transformers",
        f"hydra.run.dir={run_dir}",
        *WORKLOAD,
    ]
    done = run_cli(args, tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no run config in the trace; taken from the command line" in done.stdout
    assert "async speedup x" in done.stdout
    profile = (run_dir / "h200_transformers.yaml").read_text()
    assert "# note: " in profile and "taken from the command line" in profile
    out = json.loads((run_dir / "calibration.json").read_text())
    (check,) = out["imports"]
    fwd = check["decode_forward_ms"]
    # the forward is fitted: close to the import's (10.15 ms a decode replay), unlike the base's
    assert fwd["fitted"] == pytest.approx(fwd["import"], rel=0.03)
    base = load_config(compose_cfg(WORKLOAD)).hardware
    (rec,) = load([imported])
    rec.assumed = load_config(compose_cfg(WORKLOAD))
    base_fwd = import_check(rec, base)["decode_forward_ms"]["fitted"]
    assert abs(base_fwd - fwd["import"]) > 0.2 * fwd["import"]
    # the host's time between steps too: the import's 12.2 ms step, 2 ms of it GPU idle
    step = check["step_time_ms_p50"]
    assert step["fitted"] == pytest.approx(step["import"], rel=0.05)
    pred = out["prediction"]
    assert 1.0 < pred["speedup"] < 10.0
    assert pred["sync"]["gpu_idle_fraction"] > pred["async"]["gpu_idle_fraction"]
