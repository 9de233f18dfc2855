"""The scheduler's policy, case by case (chunked prefill, preemption, arrivals, EOS, the
carry-over index), driven like both back ends drive it (scheduler_harness.py)."""

from __future__ import annotations

import numpy as np
import pytest
from scheduler_harness import EOS, check_all_done, drive, reqs_from

from cbsim.config.schema import WorkloadConfig
from cbsim.scheduler import Scheduler, carry_over_index, default_num_kv_blocks
from cbsim.workload import Request, make_requests


def test_ignore_eos_runs_to_max_new_tokens():
    w = WorkloadConfig(batch_size=2, num_requests=2, kv_num_blocks=64, ignore_eos=True)
    reqs = reqs_from([5, 3], [6, 4])
    sched = Scheduler(w, eos_token_id=EOS)
    drive(sched, reqs, overlap=True, eos_at={0: 1, 1: 0})
    assert [sched.request(r.rid).num_outputs for r in reqs] == [6, 4]


def test_chunked_prefill_splits_long_prompts():
    w = WorkloadConfig(batch_size=4, max_batch_tokens=32, kv_num_blocks=64, chunked_prefill=True)
    reqs = reqs_from([100, 10], [3, 3])
    sched = Scheduler(w)
    batches = drive(sched, reqs, overlap=True)
    first = [
        (b.query_lens[list(b.rids).index(0)], b.sample[list(b.rids).index(0)])
        for b in batches
        if 0 in b.rids
    ]
    assert [int(q) for q, _ in first[:4]] == [32, 32, 32, 4]
    assert [bool(s) for _, s in first[:4]] == [False, False, False, True]
    assert all(b.query_tokens <= 32 for b in batches)
    # the second prompt rides along in the leftover budget of the fourth step
    assert batches[3].rids.tolist() == [0, 1] and batches[3].query_lens.tolist() == [4, 10]
    check_all_done(sched, reqs, {})


def test_without_chunked_prefill_a_prompt_waits_to_fit_whole():
    w = WorkloadConfig(
        batch_size=4, max_batch_tokens=32, kv_num_blocks=64, prompt_len=20, chunked_prefill=False
    )
    reqs = reqs_from([20, 20], [2, 2])
    sched = Scheduler(w)
    batches = drive(sched, reqs, overlap=False)
    assert batches[0].rids.tolist() == [0] and batches[0].query_lens.tolist() == [20]
    assert batches[1].rids.tolist() == [0, 1] and batches[1].query_lens.tolist() == [1, 20]
    check_all_done(sched, reqs, {})
    with pytest.raises(ValueError, match="chunked_prefill off"):
        Scheduler(w).add(reqs_from([33], [1])[0])


@pytest.mark.parametrize("overlap", [False, True])
def test_kv_exhaustion_preempts_and_recomputes(overlap):
    w = WorkloadConfig(
        batch_size=8, max_batch_tokens=64, kv_block_size=4, kv_num_blocks=24, num_requests=6
    )
    reqs = reqs_from([10, 12, 9, 14, 11, 8], [30, 25, 40, 20, 33, 28])
    sched = Scheduler(w)
    batches = drive(sched, reqs, overlap)
    assert sched.num_preemptions > 0
    assert any(sched.request(r.rid).num_preemptions for r in reqs)
    # a recompute re-prefills prompt + outputs so far in one query (or chunks of it)
    assert any(int(q) > p for b in batches for q, p in zip(b.query_lens, b.prompt_lens))
    check_all_done(sched, reqs, {})


def test_preemption_victim_is_the_back_of_the_running_queue():
    w = WorkloadConfig(batch_size=4, max_batch_tokens=64, kv_block_size=4, kv_num_blocks=6)
    reqs = reqs_from([4, 4, 4], [20, 20, 20])
    sched = Scheduler(w)
    sched.add_all(reqs)
    b = sched.schedule()
    assert b.rids.tolist() == [0, 1, 2]  # 3 blocks used
    sched.update(b, np.ones(3, dtype=np.int64))
    b = sched.schedule()  # each needs a second block: 3 more, fits
    sched.update(b, np.ones(3, dtype=np.int64))
    for _ in range(3):
        b = sched.schedule()
        sched.update(b, np.ones(b.num_samples, dtype=np.int64))
    b = sched.schedule()  # context 8 -> 9: a third block each, only 0 free: preempt rid 2
    assert sched.request(2).status == "waiting" and sched.request(2).num_preemptions == 1
    assert b.rids.tolist() == [0, 1]


def test_preempted_request_waits_for_its_pending_token():
    # async: request 1 is preempted in schedule(N+1) while its token from N is pending
    w = WorkloadConfig(batch_size=4, max_batch_tokens=64, kv_block_size=2, kv_num_blocks=4)
    reqs = reqs_from([2, 2], [5, 5])
    sched = Scheduler(w)
    sched.add_all(reqs)
    b0 = sched.schedule()  # one block each
    b1 = sched.schedule()  # position 2: a second block each, 4 used
    assert b1.placeholder.tolist() == [True, True]
    sched.update(b0, np.array([5, 6]))
    b2 = sched.schedule()  # position 3: same blocks
    sched.update(b1, np.array([5, 6]))
    b3 = sched.schedule()  # position 4: a third block each, none free: rid 1 preempted
    assert b3.rids.tolist() == [0]
    st1 = sched.request(1)
    assert st1.status == "waiting" and st1.num_preemptions == 1
    assert st1.num_scheduled == 3 and st1.num_outputs == 2  # b2's token still pending
    b4 = sched.schedule()  # blocks are free, but rid 1 waits for b2's update
    assert b4.rids.tolist() == [0]
    sched.update(b2, np.array([7, 8]))
    assert sched.outputs(1).tolist() == [6, 6, 8]
    sched.update(b3, np.array([9]))
    sched.update(b4, np.array([10]))  # rid 0 done (5 outputs)
    b5 = sched.schedule()  # rid 1 re-prefills prompt + 3 outputs, samples output 3
    assert b5.rids.tolist() == [1] and b5.query_lens.tolist() == [5] and b5.sample.all()
    assert b5.input_ids.tolist()[2:] == [6, 6, 8]


def test_online_arrivals_respected():
    w = WorkloadConfig(
        batch_size=4,
        num_requests=30,
        prompt_len=20,
        prompt_dist="uniform",
        prompt_spread=0.5,
        gen_len=8,
        gen_dist="uniform",
        gen_spread=0.5,
        arrival="poisson",
        rate=40.0,
        max_batch_tokens=64,
    )
    reqs = make_requests(w, 1000)
    for overlap in (False, True):
        sched = Scheduler(w, default_num_kv_blocks(w, reqs))
        drive(sched, reqs, overlap)  # the fake model asserts arrival_s <= now
        check_all_done(sched, reqs, {})
        firsts = [sched.request(r.rid).first_token_step for r in reqs]
        assert firsts == sorted(firsts)  # FIFO admission


def test_schedule_before_arrival_returns_none():
    w = WorkloadConfig(batch_size=2, kv_num_blocks=16)
    sched = Scheduler(w)
    sched.add(Request(0, 1.5, np.ones(4, dtype=np.int32), 2))
    assert sched.schedule(now_s=1.0) is None
    assert sched.next_arrival_s() == 1.5
    assert sched.schedule(now_s=1.5).rids.tolist() == [0]


def test_carry_over_index_in_steady_async_decode():
    w = WorkloadConfig(batch_size=3, kv_num_blocks=64)
    sched = Scheduler(w)
    sched.add_all(reqs_from([3, 5, 4], [10, 10, 10]))
    b0 = sched.schedule()
    b1 = sched.schedule()
    assert b1.kind == "decode" and b1.input_ids.tolist() == [0, 0, 0]
    assert carry_over_index(b0, b1).tolist() == [0, 1, 2]
    sched.update(b0, np.array([7, 8, 9]))
    b2 = sched.schedule()
    assert carry_over_index(b1, b2).tolist() == [0, 1, 2]
    assert carry_over_index(b0, b2).tolist() == [-1, -1, -1]  # unrelated pair
    sched.update(b1, np.array([1, 2, 3]))
    sched.update(b2, np.array([4, 5, 6]))
    b3 = sched.schedule()  # sync from here: tokens known
    assert b3.input_ids.tolist() == [4, 5, 6] and not b3.placeholder.any()
    assert sched.outputs(1).tolist() == [8, 2, 5]


def test_finishing_request_frees_its_batch_slot_and_blocks_after_update():
    w = WorkloadConfig(batch_size=1, kv_num_blocks=8, kv_block_size=4)
    sched = Scheduler(w)
    sched.add_all(reqs_from([4, 4], [1, 1]))
    b0 = sched.schedule()  # rid 0's only output: it leaves the running queue at once
    assert b0.finishing.size == 1 and sched.num_running == 1
    b1 = sched.schedule()  # rid 1 takes the slot while b0 is in flight
    assert b1.rids.tolist() == [1]
    assert sched.kv_blocks_used == 2
    assert sched.update(b0, np.array([3])) == [0]
    assert sched.kv_blocks_used == 1
    assert sched.update(b1, np.array([4])) == [1]
    assert sched.kv_blocks_used == 0 and not sched.has_unfinished()


def test_update_out_of_order_and_wrong_token_count_refused():
    w = WorkloadConfig(batch_size=2, kv_num_blocks=16)
    sched = Scheduler(w)
    sched.add_all(reqs_from([3, 3], [5, 5]))
    b0 = sched.schedule()
    b1 = sched.schedule()
    with pytest.raises(RuntimeError, match="out of order"):
        sched.update(b1, np.array([1, 1]))
    with pytest.raises(ValueError, match="1 tokens for 2"):
        sched.update(b0, np.array([1]))


def test_request_too_large_for_the_cache_refused():
    w = WorkloadConfig(batch_size=2, kv_num_blocks=2, kv_block_size=4)
    sched = Scheduler(w)
    with pytest.raises(ValueError, match="request 0.*needs 3 KV blocks"):
        sched.add(Request(0, 0.0, np.ones(6, dtype=np.int32), 4))
    with pytest.raises(ValueError, match="num_kv_blocks"):
        Scheduler(WorkloadConfig())


def test_first_token_rids_and_request_state():
    w = WorkloadConfig(batch_size=2, kv_num_blocks=16)
    sched = Scheduler(w)
    sched.add_all(reqs_from([3, 3], [2, 2]))
    b0 = sched.schedule()
    assert sched.request(0).status == "running"
    sched.update(b0, np.array([1, 2]))
    assert sorted(sched.last_first_token_rids) == [0, 1]
    b1 = sched.schedule()
    assert sched.request(0).status == "finishing"
    assert sorted(sched.update(b1, np.array([3, 4]))) == [0, 1]
    assert sched.last_first_token_rids == []
    s = sched.request(1)
    assert (s.first_token_step, s.finish_step, s.finish_reason) == (0, 1, "length")
    assert s.outputs.tolist() == [2, 4]


def test_default_workload_decode_shape():
    w = WorkloadConfig(batch_size=32, prompt_len=256, gen_len=64)
    reqs = make_requests(w, 128256)
    sched = Scheduler(w, default_num_kv_blocks(w, reqs))
    batches = drive(sched, reqs, overlap=True)
    assert len(batches) == 64
    assert batches[0].kind == "prefill" and batches[0].query_tokens == 32 * 256
    assert all(b.kind == "decode" and len(b) == 32 for b in batches[1:])
    check_all_done(sched, reqs, {})


def test_fast_path_is_taken_in_steady_decode():
    w = WorkloadConfig(batch_size=4, prompt_len=8, gen_len=40, kv_block_size=4)
    reqs = make_requests(w, 100)
    sched = Scheduler(w, default_num_kv_blocks(w, reqs))
    calls = {"general": 0}
    general = sched._commit

    def counting(*a):
        calls["general"] += 1
        return general(*a)

    sched._commit = counting
    drive(sched, reqs, overlap=True)
    assert calls["general"] == 1  # the prefill; the rest, finishing steps too, is steady
    check_all_done(sched, reqs, {})


def test_eos_output_in_flight_is_dropped():
    w = WorkloadConfig(batch_size=2, kv_num_blocks=16, ignore_eos=False)
    sched = Scheduler(w, eos_token_id=EOS)
    sched.add_all(reqs_from([3, 3], [5, 5]))
    b0 = sched.schedule()
    b1 = sched.schedule()  # both decode with placeholders: b0's tokens unknown
    assert b1.rids.tolist() == [0, 1]
    assert sched.update(b0, np.array([EOS, 11])) == [0]  # rid 0 sampled EOS
    assert sched.kv_blocks_used == 1  # its blocks are free for later batches
    b2 = sched.schedule()
    assert b2.rids.tolist() == [1]
    assert sched.update(b1, np.array([99, 12])) == []  # rid 0's 99 is dropped
    s0 = sched.request(0)
    assert s0.outputs.tolist() == [EOS] and s0.finish_reason == "eos" and s0.finish_step == 0
    assert sched.outputs(1).tolist() == [11, 12]
