"""Properties of the scheduler over random workloads (hypothesis): every request gets exactly
its tokens, EOS stops it, the steady-decode fast path builds what the general path builds, and a
scheduler that keeps no token id (the simulator's) schedules what one that keeps them does."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scheduler_harness import EOS, check_all_done, drive, workloads

from cbsim.scheduler import Scheduler


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.booleans())
def test_every_request_gets_exactly_its_tokens(wl, overlap):
    w, reqs = wl
    sched = Scheduler(w)
    drive(sched, reqs, overlap)
    check_all_done(sched, reqs, {})


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.booleans(), st.data())
def test_eos_stops_requests_and_drops_later_outputs(wl, overlap, data):
    w, reqs = wl
    w.ignore_eos = False
    eos_at = {r.rid: data.draw(st.integers(0, r.max_new_tokens + 2)) for r in reqs}
    sched = Scheduler(w, eos_token_id=EOS)
    drive(sched, reqs, overlap, eos_at)
    check_all_done(sched, reqs, eos_at)
    for r in reqs:
        st_ = sched.request(r.rid)
        k = eos_at[r.rid]
        assert st_.finish_reason == ("eos" if k < r.max_new_tokens else "length")


BATCH_FIELDS = (
    "step",
    "rids",
    "query_lens",
    "start_pos",
    "context_lens",
    "prompt_lens",
    "sample",
    "placeholder",
    "input_ids",
    "positions",
    "slot_mapping",
    "logits_indices",
    "query_tokens",
    "kv_tokens",
    "num_prefill",
    "num_decode",
    "num_samples",
    "kind",
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.booleans(), st.booleans(), st.data())
def test_steady_decode_fast_path_matches_the_general_path(wl, overlap, eos, data):
    w, reqs = wl
    w.ignore_eos = not eos
    eos_at = {r.rid: data.draw(st.integers(0, r.max_new_tokens + 2)) for r in reqs} if eos else {}
    runs = []
    for fast in (True, False):
        sched = Scheduler(w, eos_token_id=EOS)
        sched.fast_path = fast
        runs.append((sched, drive(sched, reqs, overlap, eos_at)))
    (fast_s, fast_b), (slow_s, slow_b) = runs
    assert len(fast_b) == len(slow_b)
    for a, b in zip(fast_b, slow_b):
        for f in BATCH_FIELDS:
            assert np.array_equal(getattr(a, f), getattr(b, f)), (a.step, f)
        assert all(np.array_equal(x, y) for x, y in zip(a.block_tables, b.block_tables))
    for r in reqs:
        x, y = fast_s.request(r.rid), slow_s.request(r.rid)
        assert np.array_equal(x.outputs, y.outputs)
        assert (x.first_token_step, x.finish_step, x.finish_reason, x.num_preemptions) == (
            y.first_token_step,
            y.finish_step,
            y.finish_reason,
            y.num_preemptions,
        )
    check_all_done(fast_s, reqs, eos_at)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.booleans(), st.booleans(), st.data())
def test_keeping_no_token_changes_what_is_stored_not_what_is_scheduled(wl, overlap, eos, data):
    """Preemption, recompute, chunked prefill, EOS: the same batches, but 0 for the ids of
    prompt chunks and recomputes (the rows of one-token decodes carry the latest output, as
    the carry-over needs), the same counts and steps, and no outputs."""
    w, reqs = wl
    w.ignore_eos = not eos
    eos_at = {r.rid: data.draw(st.integers(0, r.max_new_tokens + 2)) for r in reqs} if eos else {}
    runs = []
    for keep in (True, False):
        sched = Scheduler(w, eos_token_id=EOS, keep_tokens=keep)
        runs.append((sched, drive(sched, reqs, overlap, eos_at)))
    (kept_s, kept_b), (bare_s, bare_b) = runs
    assert len(kept_b) == len(bare_b)
    for a, b in zip(kept_b, bare_b):
        for f in BATCH_FIELDS:
            if f != "input_ids":
                assert np.array_equal(getattr(a, f), getattr(b, f)), (a.step, f)
        decode = (a.query_lens == 1) & a.sample & (a.start_pos >= a.prompt_lens)
        ids = np.repeat(decode, a.query_lens)
        assert np.array_equal(a.input_ids[ids], b.input_ids[ids]) and not b.input_ids[~ids].any()
    for r in reqs:
        x, y = kept_s.request(r.rid), bare_s.request(r.rid)
        assert y.outputs is None and x.num_outputs == y.num_outputs == x.outputs.size
        assert (x.first_token_step, x.finish_step, x.finish_reason, x.num_preemptions) == (
            y.first_token_step,
            y.finish_step,
            y.finish_reason,
            y.num_preemptions,
        )
    check_all_done(kept_s, reqs, eos_at)
    assert kept_s.num_preemptions == bare_s.num_preemptions
    if reqs:
        with pytest.raises(RuntimeError, match="keeps no output tokens"):
            bare_s.outputs(reqs[0].rid)
