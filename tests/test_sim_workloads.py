"""The simulator on the workloads that exercise the scheduler: arrivals, a tight KV cache,
chunked prefill, lengths files, EOS."""

from __future__ import annotations

import dataclasses

from sim_harness import check_trace, make, spans

from cbsim.metrics import MetricInputs, compute_metrics, metrics_from
from cbsim.sim import run, simulate
from cbsim.trace import schema as S


def test_online_arrivals_ttft_tpot_and_idle_host():
    cfg = make(
        num_requests=12,
        arrival="poisson",
        rate=50.0,
        prompt_dist="lognormal",
        prompt_spread=0.5,
        gen_dist="lognormal",
        gen_spread=0.5,
    )
    tr = run(cfg, "async")
    m = check_trace(tr, cfg)
    assert m["ttft_ms_p50"] > 0 and m["tpot_ms_p50"] > 0
    assert tr.other_data["sim_counters"]["host_idle_us"] > 0  # waited for arrivals
    arr = tr.instants[tr.instants.name == S.ARRIVAL]
    assert arr.ts.is_monotonic_increasing and arr.ts.iloc[-1] > 0


def test_paged_kv_capacity_preempts_and_still_finishes_everything():
    cfg = make(
        batch_size=6, num_requests=10, prompt_len=40, gen_len=60, kv_block_size=8, kv_num_blocks=30
    )
    for engine in ("sync", "async"):
        tr = run(cfg, engine)
        check_trace(tr, cfg)
        assert tr.other_data["sim_counters"]["preemptions"] > 0
        assert not tr.counters.empty and (tr.counters.kv_blocks_used <= 30).all()


def test_chunked_prefill_splits_long_prompts():
    cfg = make(batch_size=2, prompt_len=300, gen_len=4, max_batch_tokens=128)
    tr = run(cfg, "async")
    check_trace(tr, cfg)
    fwd = spans(tr, S.COMPUTE, S.FORWARD_NAMES)
    assert (fwd.query_tokens <= 128).all() and (fwd.kind != "decode").sum() >= 5


def test_lengths_from_a_file(tmp_path):
    lengths = tmp_path / "gen.txt"
    lengths.write_text("# generation lengths\n3\n9\n1\n")
    cfg = make(num_requests=5, gen_dist="file", gen_file=str(lengths))
    m = check_trace(run(cfg, "async"), cfg)
    assert m["generated_tokens"] == 3 + 9 + 1 + 3 + 9


def test_eos_on_async_computes_and_drops_one_token_per_request():
    cfg = make(batch_size=4, num_requests=6, gen_dist="uniform", gen_spread=0.5, ignore_eos=False)
    ms = check_trace(run(cfg, "sync"), cfg)
    ta = run(cfg, "async")
    ma = check_trace(ta, cfg)
    fin = ta.instants[ta.instants.name == S.FINISH]
    assert (fin.reason == "eos").all()
    c = ta.other_data["sim_counters"]
    assert 1 <= c["dropped_tokens"] <= 6 and ms["generated_tokens"] == ma["generated_tokens"]


def test_poisson_arrivals_late_in_a_long_run_do_not_stop_the_simulator():
    """Past ~1.7e4 s, arrival_s * 1e6 * 1e-6 rounds below arrival_s by more than a fixed slack:
    the scheduler must still see the request arrived once the host has slept until it."""
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


def test_eos_on_with_the_kv_cache_exactly_at_the_limit_runs():
    """With EOS on, each request may take one more token than its drawn length only where the
    context has room for it: a cache sized exactly for the longest request (prompt + gen_len - 1
    entries) runs, as it does with EOS off."""

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


def test_a_request_arriving_during_an_empty_schedule_phase_is_scheduled_next():
    """With nothing in flight, the scheduler sees the queue when the schedule phase begins; a
    request arriving before the phase ends (a fixed_us of 1 ms, as reported_stack's) is due
    already: the host schedules again at once, with no sleep and no "nothing to arrive" error.
    Fast-forwarding or stepping the steady stretches between such gaps writes the same run."""
    for engine in ("sync", "async"):
        cfg = make(
            "tiny",
            engine={"name": engine},
            batch_size=4,
            prompt_len=16,
            gen_len=16,
            arrival="poisson",
            rate=20.0,
            num_requests=8,
            seed=6,
        )
        hw = cfg.hardware
        schedule = dataclasses.replace(hw.host.schedule, fixed_us=1000.0)
        cfg.hardware = dataclasses.replace(hw, host=dataclasses.replace(hw.host, schedule=schedule))
        fast, slow = (simulate(cfg, engine, fast_forward=ff) for ff in (True, False))
        for r in (fast, slow):
            assert r.counters["requests_finished"] == 8, (engine, r.counters)
        assert fast.counters.pop("simpy_events") < slow.counters.pop("simpy_events")
        assert fast.counters == slow.counters
        assert metrics_from(MetricInputs(**fast.tables)) == metrics_from(
            MetricInputs(**slow.tables)
        )
        trace = run(cfg, engine)
        assert check_trace(trace, cfg)["requests_finished"] == 8
        assert trace.events == run(cfg, engine, fast_forward=False).events
