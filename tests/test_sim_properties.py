"""Properties of the simulator over random small workloads and engine settings (hypothesis)."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sim_harness import check_trace, make, step_times

from cbsim.sim import run
from cbsim.trace import schema as S

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def workloads(draw):
    """A small workload: a few requests, short prompts and generations, any distribution,
    offline or Poisson, with or without a tight paged KV cache, EOS on or off."""
    batch = draw(st.integers(1, 6))
    wl = {
        "batch_size": batch,
        "num_requests": draw(st.integers(1, 10)),
        "prompt_len": draw(st.integers(1, 200)),
        "prompt_dist": draw(st.sampled_from(["fixed", "uniform", "lognormal"])),
        "gen_len": draw(st.integers(1, 24)),
        "gen_dist": draw(st.sampled_from(["fixed", "uniform", "lognormal"])),
        "arrival": draw(st.sampled_from(["offline", "offline", "poisson"])),
        "rate": draw(st.sampled_from([20.0, 200.0, 2000.0])),
        "max_batch_tokens": draw(st.sampled_from([max(batch, 16), 64, 512])),
        "chunked_prefill": draw(st.booleans()),
        "kv_block_size": draw(st.sampled_from([4, 16])),
        "seed": draw(st.integers(0, 1000)),
        "ignore_eos": draw(st.booleans()),
    }
    wl["max_batch_tokens"] = max(wl["max_batch_tokens"], batch)
    for which in ("prompt", "gen"):
        dist = wl[f"{which}_dist"]
        wl[f"{which}_spread"] = 0.0 if dist == "fixed" else draw(st.sampled_from([0.3, 0.6]))
    if not wl["chunked_prefill"]:
        wl["prompt_len"] = min(wl["prompt_len"], wl["max_batch_tokens"])
        if wl["prompt_dist"] != "fixed":
            wl["chunked_prefill"] = True  # a drawn prompt may exceed the budget
    bounded = "lognormal" not in (wl["prompt_dist"], wl["gen_dist"])  # lognormal has no max
    if bounded and draw(st.booleans()):  # a tight cache: admission waits, preemption by recompute
        longest = 4 * (wl["prompt_len"] + wl["gen_len"]) + 8
        wl["kv_num_blocks"] = -(-longest // wl["kv_block_size"]) + draw(st.integers(0, 8))
    return wl


engines = st.fixed_dictionaries(
    {
        "cuda_graphs": st.booleans(),
        "streams": st.sampled_from(["three", "three", "one", "default"]),
    }
)
models = st.sampled_from(["tiny", "llama3_1b"])


def build(model, wl, eng, **extra):
    try:
        return make(model, engine={**eng, **extra}, **wl)
    except ValueError:
        assume(False)


@SETTINGS
@given(models, workloads(), engines)
def test_any_workload_both_engines_sound(model, wl, eng):
    cfg = build(model, wl, eng)
    sync, asyn = run(cfg, "sync"), run(cfg, "async")
    ms, ma = check_trace(sync, cfg), check_trace(asyn, cfg)
    # two slots: the async engine never races with itself; sync never can
    assert ms["hazards"] == 0 and ma["hazards"] == 0
    assert ms["cpu_blocks_per_step"] == 1.0 and ma["cpu_blocks_per_step"] == 1.0
    no_eos = wl["ignore_eos"]
    if (
        wl["arrival"] == "offline"
        and "kv_num_blocks" not in wl
        and eng["streams"] == "three"
        and no_eos
    ):
        # without EOS the async engine is never slower than sync by more than one step (on the
        # default stream it can be: no overlap left, and it still pays the carry-over each step)
        assert ma["total_time_s"] * 1e6 <= ms["total_time_s"] * 1e6 + step_times(sync).max()


@SETTINGS
@given(models, workloads(), engines)
def test_one_slot_async_always_hazards(model, wl, eng):
    cfg = build(model, wl, eng, io_slots=1)
    tr = run(cfg, "async")
    m = check_trace(tr, cfg)
    launches = tr.spans[(tr.spans.lane == S.HOST) & (tr.spans.name == S.LAUNCH)]
    waits = tr.spans[(tr.spans.lane == S.HOST) & (tr.spans.name == S.WAIT)]
    # a launch of step N+1 before the host waited on step N: both in flight on one slot
    wait_ts = waits.set_index("step").ts
    overlapped = any(
        s - 1 in wait_ts.index and ts < wait_ts[s - 1] for s, ts in zip(launches.step, launches.ts)
    )
    if overlapped:
        # three streams: H2D of N+1 overwrites the inputs compute N reads; one stream: the host
        # writes N+1's pinned inputs before it knows H2D N read them; the default stream
        # orders the GPU side, but the host's device-wide sync lets D2H of N+1 overwrite N's
        # tokens before the host reads them
        assert m["hazards_by_kind"].get("slot_overwrite", 0) >= 1
    else:
        assert m["hazards"] == 0


@SETTINGS
@given(workloads(), st.booleans())
def test_missing_waits_always_flagged_and_timeline_still_sound(wl, graphs):
    cfg = build("llama3_1b", wl, {"cuda_graphs": graphs}, event_waits=False)
    tr = run(cfg, "async")
    m = check_trace(tr, cfg, ordered=False)
    # compute never waits on its H2D, D2H never on its compute: one race each per step at least
    assert m["hazards_by_kind"].get("missing_event_wait", 0) >= m["steps"]


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 10_000))
def test_deterministic_per_seed(seed):
    cfg = make(
        num_requests=5,
        arrival="poisson",
        rate=300.0,
        gen_dist="lognormal",
        gen_spread=0.5,
        seed=seed,
    )
    a, b = run(cfg, "async"), run(cfg, "async")
    assert a.events == b.events and a.other_data == b.other_data
    other = dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, seed=seed + 1))
    assert run(other, "async").events != a.events
    assert np.isfinite(step_times(a)).all()
