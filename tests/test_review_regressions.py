"""Regressions found in review: each test failed before its fix (see the commit that added it)."""

from __future__ import annotations

from cbsim.sim import run
from tests.test_sim import make


def test_poisson_arrivals_late_in_a_long_run_do_not_stop_the_simulator():
    # Arrivals past ~1.7e4 s: arrival_s * 1e6 * 1e-6 rounds below arrival_s by more than the
    # 1 ps slack the simulator gave the scheduler, so after sleeping until the arrival the
    # scheduler still saw nobody arrived and the run died ("no request still to arrive").
    cfg = make(
        "tiny",
        batch_size=2,
        prompt_len=2,
        gen_len=1,
        arrival="poisson",
        rate=0.001,
        num_requests=40,
    )
    trace = run(cfg, "async")
    c = trace.other_data["sim_counters"]
    assert c["requests_finished"] == 40


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


def test_runtime_compare_on_a_cpu_fails_before_the_sync_run(tmp_path):
    # engine=compare on mode.device=cpu ran the whole sync half first (minutes for a real
    # workload) and only then refused the async half, which needs CUDA: "a wrong value fails
    # before anything runs".
    import pytest

    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.conftest import run_cli

    run_dir = tmp_path / "job"
    r = run_cli(
        [
            "mode=runtime",
            "mode.device=cpu",
            "model=tiny",
            "engine=compare",
            "workload.batch_size=2",
            "workload.gen_len=4",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "needs CUDA" in r.stderr
    assert not list(run_dir.glob("trace*")), "nothing may run on a config that cannot finish"


def _drawn_prompt_over_budget(mode: list[str], tmp_path):
    from tests.conftest import run_cli

    return run_cli(
        [
            *mode,
            "model=tiny",
            "workload.batch_size=4",
            "workload.gen_len=4",
            "workload.prompt_len=256",
            "workload.prompt_dist=lognormal",
            "workload.prompt_spread=1.0",
            "workload.chunked_prefill=false",
            "workload.max_batch_tokens=300",
            f"hydra.run.dir={tmp_path / 'job'}",
        ],
        cwd=tmp_path,
    )


def test_sim_request_that_can_never_run_is_a_config_error_not_a_traceback(tmp_path):
    # A drawn prompt over max_batch_tokens with chunked_prefill off, or a request over the KV
    # cache, raised a bare ValueError in the simulator: a traceback and exit 1, where the runtime
    # (and the README) give "cbsim: config error: ..." and exit 2.
    r = _drawn_prompt_over_budget([], tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "cbsim: config error" in r.stderr and "max_batch_tokens" in r.stderr
    assert "Traceback" not in r.stderr
    from tests.conftest import run_cli

    r = run_cli(
        [
            "model=tiny",
            "workload.batch_size=2",
            "workload.prompt_len=16",
            "workload.gen_len=18",
            "workload.kv_num_blocks=2",
            f"hydra.run.dir={tmp_path / 'kv'}",
        ],
        cwd=tmp_path,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "KV cache capacity" in r.stderr and "Traceback" not in r.stderr


def test_runtime_prompt_over_the_budget_fails_before_the_model_is_built(tmp_path):
    import pytest

    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    r = _drawn_prompt_over_budget(["mode=runtime", "mode.device=cpu", "engine=sync"], tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "cbsim: config error" in r.stderr and "max_batch_tokens" in r.stderr
    assert "Traceback" not in r.stderr


def test_eos_on_with_the_kv_cache_exactly_at_the_limit_runs():
    # With EOS on the simulator lets each request one more token than its drawn length (a server
    # cannot know where EOS falls), but only "where the context has room for it": a cache
    # sized exactly for the longest request (prompt + gen_len - 1 entries) was refused, naming a
    # max_new_tokens the user never set, while the same run with EOS off fits.
    from cbsim.metrics import compute_metrics

    for engine in ("sync", "async"):
        cfg = make(
            "tiny",
            engine={"name": engine},
            batch_size=2,
            prompt_len=16,
            gen_len=17,
            kv_block_size=16,
            kv_num_blocks=2,
            ignore_eos=False,
        )
        trace = run(cfg, engine)
        m = compute_metrics(trace)
        assert m["requests_finished"] == 2
        assert m["generated_tokens"] == 2 * 17
        fin = trace.instants[trace.instants.name == "finish"]
        assert (fin["tokens"] == 17).all()
