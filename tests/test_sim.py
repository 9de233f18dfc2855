"""The simulator's two engines end to end: overlap, the sync baseline, determinism, the
recorder, refusals, the device-memory fit."""

from __future__ import annotations

import pytest
from sim_harness import check_trace, make, spans

from cbsim.sim import run
from cbsim.trace import TraceBuilder, write_trace
from cbsim.trace import schema as S


def test_async_overlaps_the_host_and_blocks_once_per_step():
    cfg = make("llama3_8b", batch_size=32, prompt_len=256, gen_len=64)
    sync, asyn = run(cfg, "sync"), run(cfg, "async")
    ms, ma = check_trace(sync, cfg), check_trace(asyn, cfg)
    assert ms["cpu_blocks_per_step"] == ma["cpu_blocks_per_step"] == 1.0
    assert ma["total_time_s"] < ms["total_time_s"]
    assert ma["gpu_idle_fraction"] < ms["gpu_idle_fraction"]
    assert ms["hazards"] == ma["hazards"] == 0
    assert sync.other_data["engine"] == "sync" and asyn.other_data["engine"] == "async"
    assert asyn.other_data["hardware"]["name"] == "h200"
    # sync: the host waits while the GPU computes, and the GPU waits while the host works
    host = spans(sync, S.HOST)
    assert host[host.name == S.WAIT].dur.sum() > 0.5 * ms["total_time_s"] * 1e6
    # async: batch N+1 is launched before the host waits on batch N
    h = spans(asyn, S.HOST)
    launch1 = h[(h.name == S.LAUNCH) & (h.step == 1)].ts.iloc[0]
    wait0 = h[(h.name == S.WAIT) & (h.step == 0)].ts.iloc[0]
    assert launch1 < wait0
    assert asyn.other_data["sim_counters"]["carry_over_steps"] == ma["steps"] - 1


def test_compare_uses_one_slot_and_no_carry_over_for_sync():
    cfg = make(engine={"io_slots": 2})
    tr = run(cfg, "sync")
    assert tr.other_data["memory"]["io_slots"] == 1
    assert set(spans(tr, S.HOST).slot.unique()) <= {-1, 0}
    assert tr.other_data["sim_counters"]["carry_over_steps"] == 0


def test_same_config_gives_byte_identical_traces(tmp_path):
    cfg = make(
        batch_size=3,
        num_requests=7,
        prompt_dist="lognormal",
        prompt_spread=0.5,
        gen_dist="uniform",
        gen_spread=0.5,
        arrival="poisson",
        rate=500.0,
    )
    paths = [write_trace(run(cfg, "async"), tmp_path / f"t{i}.json") for i in range(2)]
    assert paths[0].read_bytes() == paths[1].read_bytes()


def test_recorder_writes_what_trace_builder_writes():
    from cbsim.sim.recorder import Recorder

    a, b = TraceBuilder("sim"), TraceBuilder("sim")
    args = {
        "step": 3,
        "slot": 1,
        "requests": 4,
        "query_tokens": 4,
        "kv_tokens": 99,
        "kind": "decode",
    }
    rec = Recorder(b, (S.HOST, S.COMPUTE))
    a.span(S.HOST, S.WAIT, 12.3456789, 0.1234567, **args)
    rec.span(S.HOST, S.WAIT, 12.3456789, 0.1234567, args)
    a.span(S.COMPUTE, S.FORWARD, 1.0, 2.0, **args, new_tokens=4)
    rec.span(S.COMPUTE, S.FORWARD, 1.0, 2.0, {**args, "new_tokens": 4})
    a.counter("scheduler", 5.0, waiting=1, running=2)
    rec.counter("scheduler", 5.0, {"waiting": 1, "running": 2})
    assert a.events == b.events


def test_unknown_engine_is_refused():
    with pytest.raises(ValueError, match="allowed: sync, async"):
        run(make(), "compare")
    with pytest.raises(ValueError, match="engine.name=sync"):
        run(make(engine={"name": "sync"}), "async")


def test_simulator_never_imports_torch():
    import subprocess
    import sys

    code = (
        "import sys, cbsim.sim, cbsim.costs; from cbsim.sim import run;"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_device_memory_fit_is_reported():
    """A what-if larger than the device still runs, and says it would not fit."""
    from conftest import make_config

    from cbsim.sim import run as simulate

    small = ["workload.gen_len=4", "workload.batch_size=2", "engine=async"]
    big = simulate(make_config(["model=llama3_70b", *small]), "async").other_data["memory"]
    assert big["fits_device"] is False and big["device_bytes_needed"] > 141e9
    ok = simulate(make_config(small), "async").other_data["memory"]
    assert ok["fits_device"] is True


def _drawn_prompt_over_budget(mode: list[str], tmp_path):
    from conftest import run_cli

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
    """A drawn prompt over max_batch_tokens with chunked_prefill off, or a request over the KV
    cache: "cbsim: config error: ..." and exit 2, as the runtime does, never a traceback."""
    r = _drawn_prompt_over_budget([], tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "cbsim: config error" in r.stderr and "max_batch_tokens" in r.stderr
    assert "Traceback" not in r.stderr
    from conftest import run_cli

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
