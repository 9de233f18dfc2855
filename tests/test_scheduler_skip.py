"""Many steady steps at once (SteadyDecode.stretch/skip, TokenUpdate.skip, which the simulator's
fast-forward uses) leave the scheduler exactly as the step-by-step schedule/update calls do."""

from __future__ import annotations

import copy

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbsim.config.schema import WorkloadConfig
from cbsim.scheduler import Scheduler, default_num_kv_blocks
from cbsim.workload import make_requests

TOKEN = 7


def state(s: Scheduler) -> dict:
    s.decode.sync()
    t = s.table
    cols = ("computed", "nsched", "nfilled", "lasttok", "nblk", "state", "seg")
    out = {c: getattr(t, c)[: t.n].copy() for c in cols}
    out["flat"] = s.blocks.flat[: s.blocks.top].copy()
    out["free"] = s.kv._stack[: s.kv.num_free].copy()
    out["outputs"] = [s.outputs(r) for r in s.rids()]
    out.update(
        step=s.step,
        next=s.updates.next_step,
        run=s.run.copy(),
        ctx=s.decode.ctx.copy(),
        fin=s.decode.fin,
        blk=s.decode.blk,
        kv=s.decode.kv,
    )
    return out


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if k == "outputs":
            assert all(np.array_equal(x, y) for x, y in zip(a[k], b[k]))
        else:
            assert np.array_equal(a[k], b[k]), k


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(1, 8),
    st.integers(1, 40),
    st.integers(12, 80),
    st.sampled_from([1, 4, 16]),
    st.integers(0, 30),
    st.integers(1, 200),
)
def test_skipping_steady_steps_equals_stepping(batch, prompt, gen, block, spare, want):
    w = WorkloadConfig(batch_size=batch, prompt_len=prompt, gen_len=gen, kv_block_size=block)
    reqs = make_requests(w, 100)
    # a cache with only some spare blocks: the stretch must stop where stepping would preempt
    blocks = sum(-(-r.prompt_len // block) + 1 for r in reqs) + spare
    blocks = min(blocks, default_num_kv_blocks(w, reqs))
    blocks = max(blocks, -(-(prompt + gen) // block))
    sched = Scheduler(w, blocks)
    sched.add_all(reqs)
    b = sched.schedule()
    sched.update(b, np.full(b.num_samples, TOKEN))
    while not sched.decode.active and sched.has_unfinished():
        b = sched.schedule()
        sched.update(b, np.full(b.num_samples, TOKEN))
    if not sched.has_unfinished():
        return
    k, admit_at = sched.decode.stretch(want, now_s=0.0)
    assert k <= want and admit_at == float("inf")
    stepped = copy.deepcopy(sched)
    for _ in range(k):
        b = stepped.schedule()
        assert b is not None and b.kind == "decode" and b.finishing.size == 0
        assert stepped.update(b, np.full(b.num_samples, TOKEN)) == []
    sched.decode.skip(k)
    sched.updates.skip(sched.run, k, TOKEN)
    assert_same(state(sched), state(stepped))
    # and both go on identically to the end
    for s in (sched, stepped):
        while s.has_unfinished():
            b = s.schedule()
            s.update(b, np.full(b.num_samples, TOKEN))
    assert_same(state(sched), state(stepped))
