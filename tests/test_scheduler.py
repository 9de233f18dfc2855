"""The scheduler driven like both back ends drive it, against a fake model that checks every
input token and samples tokens from a deterministic function of (rid, output index)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbsim.config.schema import WorkloadConfig
from cbsim.scheduler import Batch, Scheduler, carry_over_index, default_num_kv_blocks
from cbsim.workload import Request, make_requests

EOS = 0


def tok(rid: int, k: int) -> int:
    """Output k of request rid: never 0 (0 is the placeholder and the EOS id here)."""
    return (rid * 1_000_003 + k * 7919) % 50_000 + 1


class FakeModel:
    """Checks a batch's inputs, as the runtime's forward would see them after the carry-over
    scatter, and samples tok(rid, k), or EOS at the output index eos_at[rid]."""

    def __init__(self, sched: Scheduler, requests: list[Request], eos_at: dict[int, int]):
        self.sched = sched
        self.req = {r.rid: r for r in requests}
        self.eos_at = eos_at
        self.wl = sched.workload

    def out(self, rid: int, k: int) -> int:
        return EOS if self.eos_at.get(rid) == k else tok(rid, k)

    def seq_token(self, rid: int, pos: int) -> int:
        p = self.req[rid].prompt_ids
        return int(p[pos]) if pos < p.size else self.out(rid, pos - p.size)

    def forward(
        self, b: Batch, prev: Batch | None, prev_tokens: np.ndarray | None, now: float
    ) -> np.ndarray:
        n = len(b)
        assert 1 <= n <= self.wl.batch_size
        assert b.query_tokens == int(b.query_lens.sum()) <= self.wl.max_batch_tokens
        assert np.all(b.query_lens >= 1)
        assert np.unique(b.rids).size == n
        assert np.array_equal(b.context_lens, b.start_pos + b.query_lens)
        assert b.kv_tokens == int(b.context_lens.sum())
        assert b.num_prefill + b.num_decode == n
        assert b.kind == (
            "decode" if b.num_prefill == 0 else "prefill" if b.num_decode == 0 else "mixed"
        )
        assert b.num_samples == int(b.sample.sum())
        for rid in b.rids.tolist():
            assert self.req[rid].arrival_s <= now
        ids = b.input_ids.copy()
        assert ids.dtype == np.int64 and ids.size == b.query_tokens
        ph_pos = b.placeholder_positions
        assert np.all(ids[ph_pos] == 0)
        assert np.all(b.query_lens[b.placeholder] == 1)
        if prev is not None:
            carry = carry_over_index(prev, b)
            assert carry.size == prev.num_samples
            hit = carry[carry >= 0]
            # every placeholder is covered by exactly one output of prev, nothing else is
            assert sorted(hit.tolist()) == sorted(ph_pos.tolist())
            m = carry >= 0
            np.add.at(ids, carry[m], prev_tokens[m])
        else:
            assert ph_pos.size == 0, "a placeholder with no previous batch to fill it"
        pos = b.positions
        assert pos.size == b.query_tokens
        rid_of_tok = np.repeat(b.rids, b.query_lens)
        expect = [self.seq_token(r, p) for r, p in zip(rid_of_tok.tolist(), pos.tolist())]
        assert ids.tolist() == expect
        # KV slots: inside the request's own blocks, distinct, tables cover the contexts
        bs = b.block_size
        tables = b.block_tables
        arr = b.block_table_array()
        for j, t in enumerate(tables):
            assert t.size == -(-int(b.context_lens[j]) // bs)
            assert np.array_equal(arr[j, : t.size], t) and np.all(arr[j, t.size :] == -1)
        all_blocks = np.concatenate(tables)
        assert np.unique(all_blocks).size == all_blocks.size, "a block shared by two requests"
        assert all_blocks.min() >= 0 and all_blocks.max() < self.sched.kv.num_blocks
        slots = b.slot_mapping
        assert np.unique(slots).size == slots.size
        for j, (s, e) in enumerate(
            zip(b.cu_query_lens[:-1].tolist(), b.cu_query_lens[1:].tolist())
        ):
            p = pos[s:e]
            assert np.array_equal(slots[s:e], tables[j][p // bs].astype(np.int64) * bs + p % bs)
        # sampled outputs: the last query position, output index = context - prompt
        li = b.logits_indices
        assert np.array_equal(li, (b.cu_query_lens[1:] - 1)[b.sample])
        ks = (b.context_lens - b.prompt_lens)[b.sample]
        return np.array(
            [self.out(r, k) for r, k in zip(b.sample_rids.tolist(), ks.tolist())], dtype=np.int64
        )


def drive(
    sched: Scheduler,
    requests: list[Request],
    overlap: bool,
    eos_at: dict[int, int] | None = None,
    dt: float = 0.01,
) -> list[Batch]:
    """The sync or async loop with a clock; returns every batch."""
    model = FakeModel(sched, requests, eos_at or {})
    sched.add_all(requests)
    batches: list[Batch] = []
    prev, prev_tokens = None, None
    now = 0.0
    for _ in range(100_000):
        if not sched.has_unfinished():
            break
        b = sched.schedule(now)
        in_flight = prev is not None
        tokens = None
        if b is not None:
            tokens = model.forward(b, prev if overlap else None, prev_tokens, now)
            batches.append(b)
        if overlap:
            if prev is not None:
                check_finished(sched, sched.update(prev, prev_tokens))
            prev, prev_tokens = b, tokens
        elif b is not None:
            check_finished(sched, sched.update(b, tokens))
        if b is None and not in_flight:
            nxt = sched.next_arrival_s()
            assert nxt > now, "nothing scheduled, nothing in flight, yet the head has arrived"
            now = nxt
        else:
            now += dt
        check_counters(sched)
    else:
        raise AssertionError("did not finish")
    if prev is not None:
        check_finished(sched, sched.update(prev, prev_tokens))
    return batches


def check_finished(sched: Scheduler, rids: list[int]) -> None:
    for rid in rids:
        st_ = sched.request(rid)
        assert st_.status == "finished" and st_.finish_reason in ("length", "eos")


def check_counters(sched: Scheduler) -> None:
    c = sched.counters()
    assert c["kv_blocks_used"] == sched.kv.num_used
    assert 0 <= c["running"] and 0 <= c["waiting"]
    held = sched.held_blocks()
    ids = np.concatenate(list(held.values())) if held else np.empty(0, dtype=np.int32)
    assert np.unique(ids).size == ids.size, "a block held by two requests"
    assert sorted(ids.tolist()) == sched.kv.used_blocks().tolist()


def expected_outputs(r: Request, eos_at: dict[int, int]) -> list[int]:
    n = r.max_new_tokens
    k = eos_at.get(r.rid)
    if k is not None and k < n:
        n = k + 1
    return [EOS if k == i else tok(r.rid, i) for i in range(n)]


def check_all_done(sched: Scheduler, requests: list[Request], eos_at: dict[int, int]) -> None:
    assert not sched.has_unfinished()
    assert sched.kv.num_free == sched.kv.num_blocks, "blocks leaked"
    assert sched.num_running == 0 and sched.num_waiting == 0
    for r in requests:
        st_ = sched.request(r.rid)
        assert st_.outputs.tolist() == expected_outputs(r, eos_at), r.rid
        assert st_.status == "finished"
        assert st_.first_token_step >= 0 and st_.finish_step >= st_.first_token_step


def reqs_from(
    prompts: list[int], gens: list[int], arrivals: list[float] | None = None, seed: int = 0
) -> list[Request]:
    rng = np.random.default_rng(seed)
    arrivals = arrivals or [0.0] * len(prompts)
    return [
        Request(i, a, rng.integers(1, 1000, size=p, dtype=np.int32), g)
        for i, (p, g, a) in enumerate(zip(prompts, gens, arrivals))
    ]


# ---------------------------------------------------------------------------- property tests


@st.composite
def workloads(draw):
    batch_size = draw(st.integers(1, 6))
    chunked = draw(st.booleans())
    max_batch_tokens = draw(st.integers(batch_size, 48))
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    n = draw(st.integers(1, 10))
    pmax = 60 if chunked else max_batch_tokens
    prompts = draw(st.lists(st.integers(1, pmax), min_size=n, max_size=n))
    gens = draw(st.lists(st.integers(1, 25), min_size=n, max_size=n))
    online = draw(st.booleans())
    if online:
        gaps = draw(st.lists(st.sampled_from([0.0, 0.005, 0.02, 0.3]), min_size=n, max_size=n))
        arrivals = np.cumsum(gaps).tolist()
    else:
        arrivals = [0.0] * n
    largest = max(-(-(p + g) // block_size) for p, g in zip(prompts, gens))
    roomy = sum(-(-(p + g) // block_size) for p, g in zip(prompts, gens))
    num_blocks = draw(st.integers(largest, max(largest, roomy)))
    w = WorkloadConfig(
        batch_size=batch_size,
        max_batch_tokens=max_batch_tokens,
        chunked_prefill=chunked,
        kv_block_size=block_size,
        kv_num_blocks=num_blocks,
        prompt_len=1,
        num_requests=n,
    )
    return w, reqs_from(prompts, gens, arrivals, seed=n)


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


# ---------------------------------------------------------------------------- targeted tests


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
