"""Issue #39's targets across GPUs, on the H100's committed held-out set: the H200 profile the
one command made with the H100's own kernel tables (another GPU's profile: every total within
4%), and an H100 datasheet profile written from the H200's (the datasheet tier: within 10%).
The figures docs/validation.md states ("Across GPUs"); point predictions, so no bands."""

from __future__ import annotations

import pytest
from conftest import REPO, make_config

from cbsim.profiling.datasheet import run_datasheet_task
from cbsim.profiling.select import rewrite
from cbsim.validation.tasks import run_validation_task

QUIET = ["extra.bands=false", "extra.progress=false", "extra.report=false", "extra.jobs=1"]
QUIET += ["output.print_table=false"]
H100_TABLES = REPO / "cbsim" / "profiles" / "h100_80gb_hbm3" / "kernels"


def judged(tmp_path, *overrides: str) -> tuple[dict, dict]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = make_config(rewrite(["+experiment=validate", *overrides]) + QUIET)
    j = run_validation_task(cfg, {}, tmp_path)["judged"]
    rows = {r["workload"]: r for r in j["workloads"]}
    return {c["target"]: c for c in j["checks"]}, rows


def check_of(checks: dict, prefix: str) -> dict:
    (c,) = [c for name, c in checks.items() if name.startswith(prefix)]
    return c


@pytest.mark.slow
def test_the_h200_profile_with_the_h100s_tables_misses_the_4_percent_bound(tmp_path):
    checks, rows = judged(
        tmp_path, "hardware=h200_profiled", f"hardware.kernel_table={H100_TABLES}"
    )
    worst = check_of(checks, "every total, another GPU's")
    assert worst["value"] == pytest.approx(59.33, abs=0.01) and worst["passed"] is False
    assert checks["async total median |error| (%)"]["value"] == pytest.approx(4.27, abs=0.01)
    assert checks["sync total median |error| (%)"]["value"] == pytest.approx(7.57, abs=0.01)
    # the host is the H200's probes': every sync total short, the eager 1B's by 59%
    assert all(r["sync_total_pct"] < 0 for r in rows.values())
    assert rows["1b_eager_32x128+256"]["sync_total_pct"] == pytest.approx(-59.33, abs=0.01)


@pytest.mark.slow
def test_an_h100_datasheet_profile_from_the_h200s_misses_the_10_percent_bound(tmp_path):
    made = make_config(
        rewrite(["+experiment=datasheet_profiles", "hardware=h200_profiled"])
        + ["extra.gpus=[h100]", f"extra.out={tmp_path / 'profiles'}"]
    )
    run_datasheet_task(made, tmp_path, "test")
    profile = tmp_path / "profiles" / "h100_datasheet"
    checks, rows = judged(tmp_path / "judged", f"hardware={profile}")
    worst = check_of(checks, "every total, a datasheet profile")
    assert worst["value"] == pytest.approx(59.31, abs=0.01) and worst["passed"] is False
    assert checks["async total median |error| (%)"]["value"] == pytest.approx(6.68, abs=0.01)
    assert checks["sync total median |error| (%)"]["value"] == pytest.approx(4.04, abs=0.01)
    # the largest miss but the eager 1B's: the 3B's 2K prompts, computed at the H100's FLOP/s
    assert rows["3b_16x2048+256"]["async_total_pct"] == pytest.approx(11.5, abs=0.05)
