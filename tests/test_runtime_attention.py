"""The runtime's torch attention paths and the packed IO layout, against plain references."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cbsim.config.schema import WorkloadConfig  # noqa: E402
from cbsim.runtime.attention import (  # noqa: E402
    AttnMeta,
    decode_torch,
    prefill_fresh,
    prefill_torch,
)
from cbsim.runtime.io_slots import empty_decode_layout, pack, pack_decode_into  # noqa: E402
from cbsim.runtime.kv_cache import PagedKVCache  # noqa: E402
from cbsim.scheduler import Scheduler  # noqa: E402
from cbsim.workload import make_requests  # noqa: E402


def random_cache(num_blocks=12, bs=4, hkv=2, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    cache = PagedKVCache(1, num_blocks, bs, hkv, dim, torch.float64, torch.device("cpu"))
    cache.k[0].copy_(torch.randn(cache.k[0].shape, generator=g, dtype=torch.float64))
    cache.v[0].copy_(torch.randn(cache.v[0].shape, generator=g, dtype=torch.float64))
    return cache, g


def dense_kv(cache, table, n):
    """A request's first n K/V rows, read block by block."""
    k = torch.cat([cache.k[0][b] for b in table])[:n]
    v = torch.cat([cache.v[0][b] for b in table])[:n]
    return k, v


def naive(q, k, v, scale, causal_offset=None):
    """q [Q, Hq, D], k/v [S, Hkv, D]; query i sees keys 0..causal_offset+i (all if None)."""
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    s = torch.einsum("qhd,shd->hqs", q, k) * scale
    if causal_offset is not None:
        qi = torch.arange(q.shape[0])[:, None] + causal_offset
        s = s.masked_fill(torch.arange(k.shape[0])[None, :] > qi, float("-inf"))
    return torch.einsum("hqs,shd->qhd", torch.softmax(s, -1), v)


def test_decode_torch_matches_dense_attention():
    cache, g = random_cache()
    tables = [[3, 7, 1], [0], [5, 2, 9, 11]]
    ctx = [10, 3, 16]
    width = 4
    bt = torch.tensor([t + [cache.scratch_block] * (width - len(t)) for t in tables])
    q = torch.randn(3, 4, 8, generator=g, dtype=torch.float64)
    out = decode_torch(q, cache.k[0], cache.v[0], bt, torch.tensor(ctx), 0.3)
    for i, (t, n) in enumerate(zip(tables, ctx)):
        k, v = dense_kv(cache, t, n)
        torch.testing.assert_close(out[i], naive(q[i : i + 1], k, v, 0.3)[0])


def test_prefill_torch_attends_causally_after_the_cached_prefix():
    cache, g = random_cache()
    # two chunks: 5 queries after 6 cached tokens, 3 queries from position 0
    tables = [[4, 8, 6], [10]]
    starts, qlens = [6, 0], [5, 3]
    ctx = [s + q for s, q in zip(starts, qlens)]
    q = torch.randn(sum(qlens), 4, 8, generator=g, dtype=torch.float64)
    meta = AttnMeta(
        cache=cache,
        num_tokens=q.shape[0],
        slot_mapping=torch.zeros(q.shape[0], dtype=torch.long),
        ext_tok=torch.tensor([0, 5]),
        ext_qlen=torch.tensor(qlens),
        ext_start=torch.tensor(starts),
        ext_bt=torch.tensor([[4, 8, 6], [10, cache.scratch_block, cache.scratch_block]]),
        ext_qmax=5,
    )
    meta.derive()
    out = prefill_torch(q, cache.k[0], cache.v[0], meta, 0.25)
    tok = 0
    for i, t in enumerate(tables):
        k, v = dense_kv(cache, t, ctx[i])
        ref = naive(q[tok : tok + qlens[i]], k, v, 0.25, causal_offset=starts[i])
        torch.testing.assert_close(out[i, : qlens[i]], ref)
        tok += qlens[i]


def test_prefill_fresh_is_causal_over_each_chunk_and_ignores_padding():
    """Prompts from position 0: the no-gather path gives each valid query row what dense causal
    attention over its own chunk gives (the padded rows of the shorter chunk are never read)."""
    g = torch.Generator().manual_seed(1)
    qlens = [5, 3]
    t = sum(qlens)
    q = torch.randn(t, 4, 8, generator=g, dtype=torch.float64)
    k = torch.randn(t, 2, 8, generator=g, dtype=torch.float64)
    v = torch.randn(t, 2, 8, generator=g, dtype=torch.float64)
    meta = AttnMeta(
        cache=None,
        num_tokens=t,
        slot_mapping=torch.zeros(t, dtype=torch.long),
        pre_tok=torch.tensor([0, 5]),
        pre_qlen=torch.tensor(qlens),
        pre_qmax=5,
    )
    meta.derive()
    out = prefill_fresh(q, k, v, meta, 0.25)
    assert out.shape == (2, 5, 4, 8)
    tok = 0
    for i, n in enumerate(qlens):
        sl = slice(tok, tok + n)
        ref = naive(q[sl], k[sl], v[sl], 0.25, causal_offset=0)
        torch.testing.assert_close(out[i, :n], ref)
        tok += n


def test_pack_splits_prompt_starts_from_continuations():
    """Chunks from position 0 and chunks after a cached prefix are two groups, each padded to
    its own longest chunk (one group padded a 2-token continuation to an 8K prompt)."""
    w = WorkloadConfig(batch_size=2, prompt_len=12, gen_len=3, max_batch_tokens=16)
    sched = Scheduler(w, 64)
    sched.add_all(make_requests(w, 100))
    first = sched.schedule()  # prompt 0 whole, prompt 1's first 4 tokens: both from 0
    flat, layout = pack(first, 63, None, 0)
    views = layout.views(torch.from_numpy(flat))
    assert (layout.pre_qmax, layout.ext_qmax) == (12, 0)
    assert views["pre_qlen"].tolist() == [12, 4] and views["ext_tok"] is None
    sched.update(first, np.zeros(first.num_samples, dtype=np.int64))
    second = sched.schedule()  # request 0 decodes; prompt 1's rest after its cached 4 tokens
    flat, layout = pack(second, 63, None, 0)
    views = layout.views(torch.from_numpy(flat))
    assert (layout.pre_qmax, layout.ext_qmax) == (0, 8)
    assert views["pre_tok"] is None and views["dec_tok"].tolist() == [0]
    assert views["ext_start"].tolist() == [4] and views["ext_qlen"].tolist() == [8]


def test_a_step_with_prompt_tokens_is_padded_to_the_token_multiple():
    """Padding rows (engine.eager_token_multiple) write the scratch block, sit in no attention
    group and are not sampled; the real tokens keep their places."""
    w = WorkloadConfig(batch_size=2, prompt_len=12, gen_len=3, max_batch_tokens=16)
    sched = Scheduler(w, 64)
    sched.add_all(make_requests(w, 100))
    first = sched.schedule()  # 16 tokens: prompt 0 whole, prompt 1's first 4
    sched.update(first, np.zeros(first.num_samples, dtype=np.int64))
    second = sched.schedule()  # 9 tokens: one decode row, prompt 1's last 8
    plain, plain_layout = pack(second, 63, None, 0)
    flat, layout = pack(second, 63, None, 0, token_multiple=8)
    assert (second.query_tokens, plain_layout.num_tokens, layout.num_tokens) == (9, 9, 16)
    got, want = layout.views(torch.from_numpy(flat)), plain_layout.views(torch.from_numpy(plain))
    assert got["slots"][9:].tolist() == [63 * w.kv_block_size] * 7
    assert got["input_ids"][:9].tolist() == want["input_ids"].tolist()
    assert got["positions"][9:].tolist() == [0] * 7
    for name in ("logits_idx", "dec_tok", "ext_tok", "ext_qlen", "ext_start"):
        assert got[name].tolist() == want[name].tolist(), name
    # a multiple of the token count, or a step of one token per request, is left as it is
    assert pack(second, 63, None, 0, token_multiple=3)[1].num_tokens == 9
    sched.update(second, np.zeros(second.num_samples, dtype=np.int64))
    decode = sched.schedule()
    assert pack(decode, 63, None, 0, token_multiple=64)[1].num_tokens == decode.num_requests


def test_padded_decode_pack_has_the_graph_layout():
    w = WorkloadConfig(batch_size=3, num_requests=3, prompt_len=5, gen_len=4, kv_block_size=4)
    sched = Scheduler(w, 30)
    sched.add_all(make_requests(w, 100))
    first = sched.schedule()
    sched.update(first, np.ones(first.num_samples, dtype=np.int64))
    dec = sched.schedule()
    assert dec.kind == "decode"
    flat, layout = pack(dec, 30, np.arange(3), 8, pad_to=4, width=5)
    graph = empty_decode_layout(4, 5, 8)
    assert layout.offsets == graph.offsets and flat.size == graph.total
    views = layout.views(torch.from_numpy(flat))
    assert views["dec_ctx"].tolist() == [6, 6, 6, 1]
    assert views["slots"][-1].item() == 30 * 4  # the padding row writes the scratch block
    assert (views["dec_bt"][3] == 30).all()
    assert views["carry"].tolist() == [0, 1, 2, -1, -1, -1, -1, -1]


@pytest.mark.parametrize("kv_blocks", [200, 14])
def test_decode_fast_path_writes_what_pack_writes(kv_blocks):
    """pack_decode_into (straight into the pinned buffer, writing only what changed since the
    slot's last graph step) == pack(pad_to=...), step after step, on two alternating slots, with
    requests finishing (fewer rows than the bucket), the async carry-over index and, with a
    small KV cache, preemption by recompute."""
    from cbsim.scheduler import carry_over_index

    w = WorkloadConfig(
        batch_size=6,
        num_requests=9,
        prompt_len=7,
        gen_len=16,
        gen_dist="uniform",
        gen_spread=0.3,
        kv_block_size=4,
    )
    sched = Scheduler(w, kv_blocks)
    sched.add_all(make_requests(w, 100))
    dst = [np.full(4096, 7, dtype=np.int64) for _ in range(2)]
    written = [None, None]
    layout8 = empty_decode_layout(8, 6, 8)
    prev, checked, k, incremental = None, 0, 0, 0
    while sched.has_unfinished():
        batch = sched.schedule()
        if batch is not None:
            s, k = k % 2, k + 1
            if batch.query_tokens == len(batch):
                carry = carry_over_index(prev, batch) if prev is not None else None
                ref, ref_layout = pack(batch, 200, carry, 8, pad_to=8, width=6)
                incremental += written[s] is not None and written[s].idx is batch.idx
                layout, written[s] = pack_decode_into(
                    dst[s], batch, layout8, 200, carry, written[s]
                )
                assert layout.offsets == ref_layout.offsets
                assert layout.num_sample == ref_layout.num_sample
                np.testing.assert_array_equal(dst[s][: layout.total], ref)
                checked += 1
            else:  # an eager step overwrites the slot
                dst[s][:] = 7
                written[s] = None
        if prev is not None:
            sched.update(prev, np.full(prev.num_samples, 3, dtype=np.int64))
        prev = batch
    assert checked > 5 and incremental > 3
    if kv_blocks < 20:
        assert sched.num_preemptions > 0
