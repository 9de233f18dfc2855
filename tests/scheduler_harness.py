"""The scheduler driven like both back ends drive it, against a fake model that checks every
input token and samples tokens from a deterministic function of (rid, output index); and the
random workloads the scheduler's property tests draw."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from cbsim.config.schema import WorkloadConfig
from cbsim.scheduler import Batch, Scheduler, carry_over_index
from cbsim.workload import Request

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
        if self.sched.table.keep_tokens:  # one that keeps none gives 0 for prompts (checked
            rid_of_tok = np.repeat(b.rids, b.query_lens)  # in test_scheduler_properties.py)
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
