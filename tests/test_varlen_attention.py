"""runtime/kernels/varlen_attention: a mixed step's attention in one graph-capturable kernel.

Every kind of chunk in one step (decode tokens, prompts from position 0, chunks after a cached
prefix, chunks longer than a tile) against a per-token float64 attention; the torch version on the
CPU, the Triton kernel under TRITON_INTERPRET=1 where triton is installed and on CUDA (marker
`gpu`, with a graph capture replayed over a second step's metadata).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_in_triton_interpreter

from cbsim.runtime.kernels.paged_attention import triton_available
from cbsim.runtime.kernels.varlen_attention import (
    tile_capacity,
    tile_map,
    tokens_per_tile,
    varlen_attention_reference,
)

REPO = Path(__file__).resolve().parents[1]
# (cached prefix, query tokens) per sequence: decode rows, prompts, continuations, long chunks
STEP = [(40, 1), (0, 37), (5, 1), (16, 20), (0, 1), (63, 70), (0, 16), (130, 3)]


def make_step(seqs, hq=8, hkv=2, d=32, bs=16, dtype=torch.float32, capacity=12, pad=5, seed=0):
    """The step's tensors, its K/V already in shuffled pages; unused pages are NaN (poison) and
    table entries past a sequence's pages are -1."""
    g = torch.Generator().manual_seed(seed)
    ctx = [p + n for p, n in seqs]
    pages = [-(-c // bs) for c in ctx]
    num_blocks = sum(pages) + 2
    k = torch.randn(num_blocks, bs, hkv, d, generator=g).to(dtype)
    v = torch.randn(num_blocks, bs, hkv, d, generator=g).to(dtype)
    perm = torch.randperm(num_blocks, generator=g)
    width = max(pages) + 1
    bt = torch.full((capacity, width), -1, dtype=torch.int64)
    used = torch.zeros(num_blocks, dtype=torch.bool)
    i = 0
    for s, n in enumerate(pages):
        bt[s, :n] = perm[i : i + n]
        used[perm[i : i + n]] = True
        i += n
    k[~used] = float("nan")
    v[~used] = float("nan")
    qlen = np.zeros(capacity, np.int64)
    qlen[: len(seqs)] = [n for _, n in seqs]
    q0 = np.zeros(capacity, np.int64)
    q0[: len(seqs)] = np.cumsum(qlen[: len(seqs)]) - qlen[: len(seqs)]
    ctxs = np.zeros(capacity, np.int64)
    ctxs[: len(seqs)] = ctx
    t = int(qlen.sum()) + pad
    q = torch.randn(t, hq, d, generator=g).to(dtype)
    meta = [torch.from_numpy(a) for a in (q0, qlen, ctxs)]
    return q, k, v, *meta, bt


def dense(q, k, v, q0, qlen, ctx, bt):
    """Each query token over its sequence's keys 0..its position, in float64, token by token."""
    bs, hkv = k.shape[1], k.shape[2]
    g = q.shape[1] // hkv
    out = torch.zeros(q.shape, dtype=torch.float64)
    for s in range(len(qlen)):
        c = int(ctx[s])
        keys = [(int(bt[s, t // bs]), t % bs) for t in range(c)]
        ks = torch.stack([k[p, o] for p, o in keys]).double() if keys else None
        vs = torch.stack([v[p, o] for p, o in keys]).double() if keys else None
        for i in range(int(qlen[s])):
            pos = c - int(qlen[s]) + i
            row = int(q0[s]) + i
            for h in range(q.shape[1]):
                w = torch.softmax(
                    ks[: pos + 1, h // g] @ q[row, h].double() * q.shape[2] ** -0.5, 0
                )
                out[row, h] = w @ vs[: pos + 1, h // g]
    return out


def live_rows(qlen) -> int:
    return int(qlen.sum())


def test_tile_map_covers_each_chunk_once():
    qlen = np.array([1, 37, 0, 16, 17, 0])
    seq, first = tile_map(qlen, tile_capacity(int(qlen.sum()), len(qlen), 16), 16)
    tiles = [(int(s), int(f)) for s, f in zip(seq, first) if s >= 0]
    assert tiles == [(0, 0), (1, 0), (1, 16), (1, 32), (3, 0), (4, 0), (4, 16)]
    assert (seq[len(tiles) :] == -1).all()
    with pytest.raises(RuntimeError, match="capacity"):
        tile_map(qlen, 5, 16)


def test_tokens_per_tile_fills_the_rows():
    assert tokens_per_tile(32, 8) == 16  # Llama 8B: 4 query heads a kv head
    assert tokens_per_tile(24, 8) == 16  # 3 heads, padded to 4
    assert tokens_per_tile(8, 8) == 64
    assert tokens_per_tile(64, 1) == 1


def test_reference_matches_per_token_attention():
    q, k, v, q0, qlen, ctx, bt = make_step(STEP)
    out = torch.zeros_like(q)
    varlen_attention_reference(q, k, v, out, q0, qlen, ctx, bt, q.shape[2] ** -0.5)
    ref = dense(q, k, v, q0, qlen, ctx, bt)
    n = live_rows(qlen)
    assert torch.allclose(out[:n].double(), ref[:n], atol=1e-5)
    assert (out[n:] == 0).all()  # padding rows are left alone


@pytest.mark.slow
@pytest.mark.skipif(not triton_available(), reason="triton not installed")
def test_kernel_in_interpreter():
    """The kernel's paging, tiling, causal masks and grouped heads on the CPU."""
    script = textwrap.dedent(
        f"""
        import sys, torch
        sys.path.insert(0, {str(REPO)!r}); sys.path.insert(0, {str(REPO / "tests")!r})
        from runtime.kernels.varlen_attention import (
            tile_capacity, tile_map, tokens_per_tile, varlen_paged_attention)
        from test_varlen_attention import STEP, dense, make_step
        for hq, hkv in ((8, 2), (6, 2)):
            q, k, v, q0, qlen, ctx, bt = make_step(STEP, hq=hq, hkv=hkv)
            bq = tokens_per_tile(hq, hkv)
            cap = tile_capacity(q.shape[0], len(qlen), bq)
            seq, first = (torch.from_numpy(a) for a in tile_map(qlen.numpy(), cap, bq))
            out = torch.full_like(q, float("nan"))
            varlen_paged_attention(q, k, v, out, q0, qlen, ctx, bt, seq, first, q.shape[2]**-0.5)
            n = int(qlen.sum())
            ref = dense(q, k, v, q0, qlen, ctx, bt)
            err = (out[:n].double() - ref[:n]).abs().max().item()
            assert err < 1e-4, (hq, err)
            assert out[n:].isnan().all()
        print("ok")
        """
    )
    run_in_triton_interpreter(script)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernel_on_cuda_in_a_graph(dtype):
    """Captured once over one step's metadata buffers, replayed over another step's."""
    from cbsim.runtime.kernels.varlen_attention import varlen_paged_attention

    first = make_step(STEP, hq=32, hkv=8, d=128, dtype=dtype, capacity=12, pad=0, seed=1)
    second = make_step(
        [(300, 1), (0, 100), (17, 1), (0, 2)], hq=32, hkv=8, d=128, dtype=dtype, capacity=12,
        pad=first[0].shape[0] - 104, seed=2,
    )  # fmt: skip
    bq = tokens_per_tile(32, 8)
    cap = tile_capacity(first[0].shape[0], 12, bq)
    bufs = [t.cuda() for t in first]
    blocks = max(first[1].shape[0], second[1].shape[0])
    bufs[1] = torch.zeros((blocks, *first[1].shape[1:]), dtype=dtype, device="cuda")
    bufs[2] = torch.zeros_like(bufs[1])
    width = max(first[-1].shape[1], second[-1].shape[1])
    bufs[-1] = torch.full((12, width), -1, dtype=torch.int64, device="cuda")
    tiles = [torch.zeros(cap, dtype=torch.int64, device="cuda") for _ in range(2)]
    out = torch.full_like(bufs[0], float("nan"))

    def load(step):
        for dst, src in zip(bufs[3:6], step[3:6]):
            dst.copy_(src)
        bufs[6].fill_(-1)
        bufs[6][:, : step[6].shape[1]].copy_(step[6])
        for dst, src in zip(tiles, tile_map(step[4].numpy(), cap, bq)):
            dst.copy_(torch.from_numpy(src))

    scale = 128**-0.5
    load(first)
    varlen_paged_attention(*bufs[:3], out, *bufs[3:], *tiles, scale)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        varlen_paged_attention(*bufs[:3], out, *bufs[3:], *tiles, scale)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    for step in (first, second):
        q, k, v = step[:3]
        bufs[0].copy_(q)
        bufs[1][: k.shape[0]].copy_(k)
        bufs[2][: v.shape[0]].copy_(v)
        load(step)
        graph.replay()
        n = int(step[4].sum())
        ref = dense(*(t.cpu() for t in step))
        assert (out[:n].double().cpu() - ref[:n]).abs().max() < tol
