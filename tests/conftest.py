"""Shared fixtures: compose configs through Hydra exactly as the CLI does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hypothesis import settings
from omegaconf import DictConfig

from cbsim.config.store import load_config, register_configs

register_configs()
# CI draws the same examples every run (a red run is reproducible, a green one stays green);
# locally hypothesis explores new ones each time
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")
REPO = Path(__file__).resolve().parents[1]
RECORDINGS = REPO / "experiments" / "recordings"
# the unfitted first estimates as a roofline (no kernel tables, no clock throttling, no forward
# error of their own): the base of the synthetic recovery tests and of the band tests, which set
# their own truth and spread on it, so a newly fitted default moves none of them
UNFITTED = (
    "hardware=h200_estimates",
    "hardware.kernel_table=null",
    "hardware.gpu.clock.min_ratio=1",
    "hardware.gpu.spread.forward_error=0",
)


def assert_nests(trace) -> None:
    """Every lane of ``trace`` (a Trace, or a path to a trace file) nests as Perfetto reads it:
    no span starts inside another and ends past it."""
    from cbsim.trace.checks import badly_nested
    from cbsim.trace.load import load_json

    if isinstance(trace, (str, Path)):
        events = load_json(trace)["traceEvents"]
    else:
        events = trace.events
    assert badly_nested(events) == []


def compose_cfg(overrides: list[str] | None = None) -> DictConfig:
    with initialize_config_module(config_module="cbsim.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides or [])


def make_config(overrides: list[str] | None = None):
    return load_config(compose_cfg(overrides))


def validate_recorded(out_dir: Path, traces: str, *overrides: str) -> dict:
    """``+experiment=validate`` on committed recordings (``traces``: comma-separated globs under
    experiments/recordings) with ``overrides``, quietly (no report, progress or table): the task's
    output, as metrics.json holds it."""
    from cbsim.validation.tasks import run_validation_task

    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = make_config(
        [
            "+experiment=validate",
            f"extra.recordings={RECORDINGS}",
            f"trace=[{traces}]",
            "extra.report=false",
            "extra.progress=false",
            "output.print_table=false",
            *overrides,
        ]
    )
    return run_validation_task(cfg, {}, out_dir)


def shipped_async_runs(out_dir: Path, cases: dict[str, tuple[str, ...]], *overrides: str) -> list:
    """The async runs of ``cases`` (a set under experiments/recordings, e.g. h200/fit_a -> its case
    names) validated with the shipped profile, which none of them entered (holdout=profile)."""
    trace = ",".join(
        f"{part}/{case}/trace_async.json.gz" for part, names in cases.items() for case in names
    )
    runs = validate_recorded(out_dir, trace, "hardware=h200", "extra.holdout=profile", *overrides)[
        "runs"
    ]
    assert len(runs) == sum(len(names) for names in cases.values())
    return runs


def recorded(path: str):
    """A committed recording (a path under experiments/recordings) as calibration reads it."""
    from cbsim.calibration.recordings import Recorded
    from cbsim.trace import read_trace

    p = RECORDINGS / path
    return Recorded(path=p, trace=read_trace(str(p)), root=RECORDINGS)


# The interpreter turns a loaded scalar (a one-element array) into a loop bound with int(),
# which numpy >= 2.4 refuses for arrays of one dimension; the shim takes the element instead.
INTERPRETER_SHIM = """
import triton.runtime.interpreter as _interp
_patch_tensor = _interp._patch_lang_tensor
def _scalar_index(tensor, scope):
    _patch_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
_interp._patch_lang_tensor = _scalar_index
"""


def run_in_triton_interpreter(script: str) -> None:
    """``script`` in a fresh interpreter with TRITON_INTERPRET=1 (Triton kernels on the CPU);
    it prints ``ok`` when its checks pass."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run(
        [sys.executable, "-c", INTERPRETER_SHIM + script],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]


def run_cli(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cbsim", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def config_factory():
    return make_config


# Tests that take 15 s or more on two cores, longest first: started before the rest,
# so that the two workers of `pytest -n 2` finish together rather than one running the last
# long test alone.
LONGEST_FIRST = (
    "test_validate_by_default_judges_the_newest_profile",
    "test_the_h200_profile_with_the_h100s_tables",
    "test_an_h100_datasheet_profile_from_the_h200s",
    "test_the_readme_first_command_passes_from_the_checkout_root",
    "test_the_command_writes_one_profile_directory",
    "test_a_sweep_killed_at_random_points",
    "test_a_run_without_a_trace_draws_its_report",
    "test_kernel_tables_made_before_are_given_named",
    "test_rows_per_step_kind_and_a_refusal",
    "test_metrics_without_a_trace_are_the_trace_s",
    "test_a_shipped_profile_is_what_refit_makes",
)


def _start_rank(item) -> int:
    """Where a test starts: its place in LONGEST_FIRST, else after all of them."""
    return next((i for i, n in enumerate(LONGEST_FIRST) if n in item.nodeid), len(LONGEST_FIRST))


def pytest_collection_modifyitems(config, items) -> None:
    items.sort(key=_start_rank)
