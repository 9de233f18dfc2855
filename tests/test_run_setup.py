"""The one setup both back ends start from (cbsim.run_setup)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_config

from cbsim.config.errors import ConfigError
from cbsim.run_setup import engine_config, setup_run


def test_setup_draws_the_requests_queues_them_and_sizes_the_cache():
    cfg = make_config(["workload.batch_size=4", "workload.num_requests=6", "model=tiny"])
    s = setup_run(cfg, engine="async")
    assert [r.rid for r in s.requests] == list(range(6))
    arrivals = list(s.arrivals())
    assert [a.rid for a in arrivals] == list(range(6))
    assert arrivals[0].prompt_len == s.requests[0].prompt_len
    assert s.scheduler.num_waiting == 6
    w = cfg.workload
    assert s.num_kv_blocks == 6 * -(-(w.prompt_len + w.gen_len) // w.kv_block_size)
    assert s.max_context == w.prompt_len + w.gen_len


def test_a_simulation_reads_no_prompt_id_and_the_runtime_s_setup_keeps_every_token(
    monkeypatch,
):
    """The simulator's memory per request: its setup and its run never read a prompt id (the
    workload never draws them) and its scheduler keeps counts; the runtime's setup keeps both."""
    from cbsim.scheduler import run_to_completion
    from cbsim.sim import simulate
    from cbsim.workload import PromptIds

    cfg = make_config(["workload.batch_size=4", "workload.num_requests=10", "model=tiny"])
    cfg.workload.ignore_eos = False
    real = PromptIds.__getitem__

    def refuse(self, rid):
        raise AssertionError("the simulation read a prompt id")

    monkeypatch.setattr(PromptIds, "__getitem__", refuse)
    for engine in ("sync", "async"):
        assert simulate(cfg, engine).counters["requests_finished"] == 10
    sim = setup_run(cfg, engine="async")
    with pytest.raises(RuntimeError, match="keeps no output tokens"):
        sim.scheduler.outputs(0)
    monkeypatch.setattr(PromptIds, "__getitem__", real)
    runtime = setup_run(cfg, engine="async", keep_tokens=True)
    first = runtime.scheduler.schedule()
    assert first is not None and first.kind == "prefill"
    ids = np.concatenate([runtime.requests[r].prompt_ids for r in first.rids.tolist()])
    assert np.array_equal(first.input_ids, ids)
    sample = lambda b: np.full(b.num_samples, 5, dtype=np.int64)  # noqa: E731
    runtime.scheduler.update(first, sample(first))
    run_to_completion(runtime.scheduler, sample)
    assert runtime.scheduler.outputs(0).tolist() == [5] * cfg.workload.gen_len


def test_io_slots_are_decided_once_one_for_sync_the_config_s_for_async():
    cfg = make_config(["engine=compare", "engine.io_slots=2", "model=tiny"])
    assert setup_run(cfg, engine="sync").io_slots == 1
    assert setup_run(cfg, engine="async").io_slots == 2
    one = make_config(["engine=async", "engine.io_slots=1", "model=tiny"])
    assert setup_run(one).io_slots == 1  # the simulator's overwrite what-if
    assert setup_run(make_config(["engine=sync", "model=tiny"])).io_slots == 1


def test_the_device_fit_adds_weights_kv_io_and_graph_pool_against_the_hardware():
    fit = setup_run(make_config(["engine=async"])).fit
    assert fit.bytes_needed == sum(fit.parts.values())
    assert set(fit.parts) == {
        "weight_bytes",
        "kv_cache_bytes",
        "io_buffer_bytes",
        "graph_pool_bytes",
    }
    assert fit.fits and fit.bytes_available > fit.bytes_needed
    huge = make_config(["engine=async", "workload.batch_size=128", "workload.gen_len=32000"])
    big = setup_run(huge).fit
    assert not big.fits and big.bytes_needed > big.bytes_available
    no_graphs = setup_run(make_config(["engine=async", "engine.cuda_graphs=false"])).fit
    assert no_graphs.parts["graph_pool_bytes"] == 0


def test_eos_headroom_tells_the_scheduler_one_more_token_may_come():
    cfg = make_config(["workload.ignore_eos=false", "model=tiny", "workload.batch_size=2"])
    plain = setup_run(cfg, eos_token_id=5)
    roomy = setup_run(cfg, eos_token_id=5, eos_headroom=True)
    gen = cfg.workload.gen_len
    assert plain.scheduler.request(0).max_new_tokens == gen
    assert roomy.scheduler.request(0).max_new_tokens == gen + 1
    assert roomy.requests[0].max_new_tokens == gen  # as drawn
    assert roomy.scheduler.eos_token_id == 5
    off = make_config(["model=tiny", "workload.batch_size=2"])  # ignore_eos: no EOS, no headroom
    s = setup_run(off, eos_token_id=5, eos_headroom=True)
    assert s.scheduler.eos_token_id is None
    assert s.scheduler.request(0).max_new_tokens == gen


def test_a_request_that_can_never_run_is_a_config_error_naming_it():
    cfg = make_config(["model=tiny", "workload.kv_num_blocks=2", "workload.kv_block_size=16"])
    with pytest.raises(ConfigError, match="request 0: .*KV cache capacity"):
        setup_run(cfg)


def test_engine_config_runs_the_sync_side_of_a_comparison_as_the_baseline():
    cfg = make_config(["engine=compare"])
    sync = engine_config(cfg, "sync")
    assert (sync.name, sync.io_slots, sync.carry_over) == ("sync", 1, False)
    assert engine_config(cfg, "async").name == "async"
    with pytest.raises(ConfigError, match="allowed: sync, async"):
        engine_config(cfg, "compare")
    with pytest.raises(ConfigError, match="engine.name=sync"):
        engine_config(make_config(["engine=sync"]), "async")
