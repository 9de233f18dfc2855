"""Regressions found in review: each test failed before its fix (see the commit that added it)."""

from __future__ import annotations


def test_a_rerun_that_fails_leaves_no_stale_metrics_of_the_old_config(tmp_path):
    # A job directory re-run with another config (a resumed sweep whose values changed) kept
    # the old metrics.json when the new run failed or was interrupted: the sweep summary then
    # listed the job as finished, with the old config's metrics under the new overrides.
    from cbsim.sweep.summary import FINISHED, collect_jobs
    from tests.conftest import run_cli

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
