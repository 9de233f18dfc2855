"""runtime/kernels: paged decode attention (reference, gathered SDPA, Triton) and fused projections.

The reference and SDPA versions run on the CPU against an explicit per-request dense attention in
float64. The Triton kernel runs on CUDA (marker `gpu`) and, where triton is installed, once on the CPU
under TRITON_INTERPRET=1 (in a subprocess, since the variable is read when triton is imported).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from conftest import run_in_triton_interpreter

from cbsim.runtime.kernels.paged_attention import (
    get_decode_attention,
    paged_decode_attention_reference,
    paged_decode_attention_sdpa,
    store_kv,
    triton_available,
)

REPO = Path(__file__).resolve().parents[1]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def make_paged(B, Hq, Hkv, D, block_size, ctxs, dtype, device="cpu", spare_cols=2, seed=0):
    """Random paged caches with shuffled pages; unused pages and table entries are poison (NaN, -1)."""
    g = torch.Generator().manual_seed(seed)
    pages = [-(-c // block_size) for c in ctxs]
    num_blocks = sum(pages) + 3
    k = torch.randn(num_blocks, block_size, Hkv, D, generator=g).to(dtype)
    v = torch.randn(num_blocks, block_size, Hkv, D, generator=g).to(dtype)
    perm = torch.randperm(num_blocks, generator=g)
    tables = torch.full((B, max(pages) + spare_cols), -1, dtype=torch.int32)
    used = torch.zeros(num_blocks, dtype=torch.bool)
    i = 0
    for b, n in enumerate(pages):
        tables[b, :n] = perm[i : i + n].int()
        used[perm[i : i + n]] = True
        i += n
    k[~used] = float("nan")
    v[~used] = float("nan")
    q = torch.randn(B, Hq, D, generator=g).to(dtype)
    lens = torch.tensor(ctxs, dtype=torch.int32)
    return [t.to(device) for t in (q, k, v, tables, lens)]


def dense_attention(q, k_cache, v_cache, tables, lens, scale):
    """Per request: gather its live tokens page by page, repeat kv heads, softmax(q k^T) v in float64."""
    B, Hq, D = q.shape
    block_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros(B, Hq, D, dtype=torch.float64)
    for b in range(B):
        n = int(lens[b])
        if n == 0:
            continue
        slots = [(int(tables[b, t // block_size]), t % block_size) for t in range(n)]
        k = torch.stack([k_cache[p, s] for p, s in slots]).double()  # [n, Hkv, D]
        v = torch.stack([v_cache[p, s] for p, s in slots]).double()
        k = k.repeat_interleave(Hq // Hkv, dim=1)  # [n, Hq, D]
        v = v.repeat_interleave(Hq // Hkv, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].double(), k) * scale
        out[b] = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), v)
    return out


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


SHAPES = [
    # B, Hq, Hkv, D, block_size, context lengths (0 = a padding row)
    (3, 8, 2, 16, 4, [1, 37, 70]),
    (4, 4, 4, 32, 16, [0, 5, 100, 33]),
    (2, 6, 2, 16, 8, [50, 17]),  # 3 query heads per kv head
    (5, 32, 8, 64, 16, [256, 1, 17, 300, 64]),  # Llama-3 head ratio
]


@pytest.mark.parametrize("shape", SHAPES)
def test_reference_matches_dense(shape):
    B, Hq, Hkv, D, bs, ctxs = shape
    q, k, v, tables, lens = make_paged(B, Hq, Hkv, D, bs, ctxs, torch.float32)
    out = paged_decode_attention_reference(q, k, v, tables, lens, D**-0.5)
    ref = dense_attention(q, k, v, tables, lens, D**-0.5)
    assert out.shape == (B, Hq, D) and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < 1e-6
    assert (out[lens == 0] == 0).all()


@pytest.mark.parametrize("shape", SHAPES)
def test_sdpa_gather_matches_dense(shape):
    B, Hq, Hkv, D, bs, ctxs = shape
    q, k, v, tables, lens = make_paged(B, Hq, Hkv, D, bs, ctxs, torch.float32)
    # SDPA's masked rows still multiply the (poisoned) values by zero weights: give it finite pages
    k, v = k.nan_to_num(0.0), v.nan_to_num(0.0)
    out = paged_decode_attention_sdpa(q, k, v, tables, lens, D**-0.5)
    ref = dense_attention(q, k, v, tables, lens, D**-0.5)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < 1e-5


def test_reference_keeps_bf16_dtype():
    q, k, v, tables, lens = make_paged(2, 8, 2, 32, 16, [40, 3], torch.bfloat16)
    out = paged_decode_attention_reference(q, k, v, tables, lens, 32**-0.5)
    ref = dense_attention(q, k, v, tables, lens, 32**-0.5)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, ref) < 1e-2


def test_store_kv_writes_slots():
    k = torch.zeros(4, 8, 2, 16)
    v = torch.zeros(4, 8, 2, 16)
    key, value = torch.randn(3, 2, 16), torch.randn(3, 2, 16)
    slots = torch.tensor([0, 13, 31])
    store_kv(k, v, key, value, slots)
    assert (
        torch.equal(k[0, 0], key[0])
        and torch.equal(k[1, 5], key[1])
        and torch.equal(k[3, 7], key[2])
    )
    assert torch.equal(v[1, 5], value[1])
    assert (k.abs().sum(dim=(2, 3)) != 0).sum() == 3  # nothing else written


def test_bad_shapes_are_named():
    q, k, v, tables, lens = make_paged(2, 6, 4, 16, 4, [3, 4], torch.float32)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        paged_decode_attention_reference(q, k, v, tables, lens, 1.0)


def test_pick_partition():
    from cbsim.costs.decode_kernel import RULE_BEFORE
    from cbsim.runtime.kernels.paged_attention import pick_partition

    # the default rule: about 256 programs, partitions of at least 128 tokens
    assert pick_partition(32, 8, 8192) == 8192  # 256 programs already: one partition
    assert pick_partition(4, 8, 8192) == 1024  # 8 partitions: 256 programs
    assert pick_partition(1, 8, 1024) == 128  # never below 128 tokens
    assert pick_partition(32, 8, 16) == 128
    # the rule before it: about 1024 programs, partitions of at least 1024 tokens
    assert pick_partition(32, 8, 8192, rule=RULE_BEFORE) == 2048  # 4 partitions: 1024 programs
    assert pick_partition(32, 8, 1024, rule=RULE_BEFORE) == 1024  # one partition: no reduce
    assert pick_partition(4, 8, 8192, rule=RULE_BEFORE) == 1024  # never below 1024 tokens


@pytest.mark.parametrize("kv_heads", [4, 8, 40])
def test_rows_past_one_split_each_add_no_compiled_variant(kv_heads):
    """compiled_variants stops at the rows from which every table is one split per (request,
    kv head): every (rows, width) past it has the launch constexprs of that row count."""
    from cbsim.costs.decode_kernel import RULE_BEFORE, LaunchRule
    from cbsim.runtime.kernels.paged_attention import compiled_variants, pick_partition, pick_tile

    for rule in (LaunchRule.of(), RULE_BEFORE):
        full = -(-rule.target_programs // kv_heads)
        for width in (1, 7, 16, 130, 513):
            ctx = width * 16
            at_full = pick_partition(full, kv_heads, ctx, rule=rule)
            for rows in (full + 1, 2 * full, 3 * full + 5):
                assert pick_partition(rows, kv_heads, ctx, rule=rule) == at_full

        # every launch a batch of up to 3 x full rows can take is compiled by the capped list
        def key(rows, width, rule=rule):
            ctx = width * 16
            part = pick_partition(rows, kv_heads, ctx, pick_tile(ctx, rule), rule)
            splits = -(-ctx // part)
            pow2 = 1 << (splits - 1).bit_length()
            tile = pick_tile(ctx, rule)
            return tile, part, splits == 1, pow2, splits % 16 == 0, width == 1, width % 16 == 0

        compiled = {key(r, w) for r, w in compiled_variants(3 * full, kv_heads, 80, 16, rule)}
        every = {key(r, w) for r in range(1, 3 * full + 1) for w in range(1, 81)}
        assert every == compiled


def test_get_decode_attention_on_cpu():
    assert get_decode_attention("torch", "cpu") is paged_decode_attention_sdpa
    assert get_decode_attention("auto", "cpu") is paged_decode_attention_sdpa
    with pytest.raises(RuntimeError, match="CUDA"):
        get_decode_attention("triton", "cpu")
    with pytest.raises(ValueError):
        get_decode_attention("flash", "cpu")


@pytest.mark.slow
@pytest.mark.skipif(not triton_available(), reason="triton not installed")
def test_triton_kernel_in_interpreter():
    """The kernel's logic (paging, splits, reduce, padding rows, poisoned pages) on the CPU."""
    script = textwrap.dedent(
        f"""
        import sys, torch
        sys.path.insert(0, {str(REPO)!r}); sys.path.insert(0, {str(REPO / "tests")!r})
        from runtime.kernels.paged_attention import paged_decode_attention
        from test_kernels import SHAPES, dense_attention, make_paged, rel_err
        for B, Hq, Hkv, D, bs, ctxs in SHAPES[:3]:
            q, k, v, tables, lens = make_paged(B, Hq, Hkv, D, bs, ctxs, torch.float32)
            ref = dense_attention(q, k, v, tables, lens, D**-0.5)
            for part, block_n in ((None, 64), (32, 16), (16, 16), ("auto", "auto"), (64, "auto")):
                out = torch.full_like(q, float("nan"))
                paged_decode_attention(q, k, v, tables, lens, D**-0.5, partition_size=part,
                                       block_n=block_n, out=out)
                assert torch.isfinite(out).all(), (ctxs, part)
                assert rel_err(out, ref) < 1e-5, (ctxs, part, rel_err(out, ref))
        print("ok")
        """
    )
    run_in_triton_interpreter(script)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("partition", [None, 64, 512, "auto"])
@pytest.mark.parametrize("longest", [1000, 2049])  # table width <= 2048 picks 128-token tiles
def test_triton_kernel_on_cuda(dtype, partition, longest):
    from cbsim.runtime.kernels.paged_attention import paged_decode_attention

    ctxs = [1, 15, 16, 17, 255, 999, longest, 0]
    q, k, v, tables, lens = make_paged(8, 32, 8, 128, 16, ctxs, dtype, device="cuda", seed=7)
    out = torch.full_like(q, float("nan"))
    paged_decode_attention(q, k, v, tables, lens, 128**-0.5, partition_size=partition, out=out)
    ref = dense_attention(*(t.cpu() for t in (q, k, v, tables, lens)), 128**-0.5)
    assert torch.isfinite(out).all()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert rel_err(out.cpu(), ref) < tol


@pytest.mark.gpu
@needs_cuda
def test_triton_kernel_graph_capture():
    from cbsim.runtime.kernels.paged_attention import paged_decode_attention

    q, k, v, tables, lens = make_paged(
        4, 32, 8, 128, 16, [100, 900, 1, 2000], torch.bfloat16, "cuda"
    )
    out = torch.empty_like(q)
    paged_decode_attention(q, k, v, tables, lens, 0.1, out=out)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_decode_attention(q, k, v, tables, lens, 0.1, out=out)
    # same shapes, new (shorter: the tables hold no pages past the first lengths) lengths
    lens.copy_(torch.tensor([50, 450, 1, 1999], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    ref = paged_decode_attention_reference(q, k.nan_to_num(0), v.nan_to_num(0), tables, lens, 0.1)
    assert rel_err(out, ref) < 1e-2


# ---------------------------------------------------------------------------------------------
# Fused projections


def tiny_llama(seed=0, attention_bias=False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        attention_bias=attention_bias,
    )
    config._attn_implementation = "eager"
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("attention_bias", [False, True])
def test_fused_projections_keep_logits(attention_bias):
    from cbsim.runtime.kernels.fused_projections import FusedLinear, fuse_qkv_and_gate_up

    model = tiny_llama(attention_bias=attention_bias)
    ids = torch.randint(0, 97, (3, 11))
    with torch.no_grad():
        before = model(ids).logits
        n_params = sum(p.numel() for p in model.parameters())
        assert fuse_qkv_and_gate_up(model) == 4  # 2 layers x (qkv, gate_up)
        after = model(ids).logits
    assert sum(p.numel() for p in model.parameters()) == n_params  # no weight kept twice
    assert sum(isinstance(m, FusedLinear) for m in model.modules()) == 4
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


def test_fused_projections_greedy_generate_unchanged():
    from cbsim.runtime.kernels.fused_projections import fuse_qkv_and_gate_up

    model = tiny_llama(seed=3)
    ids = torch.randint(0, 97, (2, 5))
    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        before = model.generate(ids, **kwargs)
        fuse_qkv_and_gate_up(model)
        after = model.generate(ids, **kwargs)
    assert torch.equal(before, after)


def test_fused_slice_recomputes_for_another_input():
    from cbsim.runtime.kernels.fused_projections import fuse_linears

    owner = torch.nn.Module()
    owner.a = torch.nn.Linear(8, 3)
    owner.b = torch.nn.Linear(8, 5)
    wa, wb = owner.a.weight.detach().clone(), owner.b.weight.detach().clone()
    ba, bb = owner.a.bias.detach().clone(), owner.b.bias.detach().clone()
    fuse_linears(owner, ["a", "b"], "ab")
    x, y = torch.randn(2, 8), torch.randn(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(owner.a(x), x @ wa.T + ba)
        torch.testing.assert_close(owner.b(y), y @ wb.T + bb)  # a different input: recomputed
        torch.testing.assert_close(owner.b(x), x @ wb.T + bb)
    assert torch.equal(owner.b.weight, wb)


# ---------------------------------------------------------------------------------------------
# Fused RMSNorm and RoPE


def test_norm_rope_fallback_on_cpu_keeps_logits():
    from cbsim.runtime.kernels.fused_elementwise import fuse_norm_and_rope, unfuse_norm_and_rope

    model = tiny_llama(seed=5)
    ids = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        before = model(ids).logits
        counts = fuse_norm_and_rope(model)
        try:
            after = model(ids).logits  # CPU tensors: the wrappers fall back to transformers' code
        finally:
            unfuse_norm_and_rope(model)
    assert counts["rms_norms"] == 2 * 2 + 1
    assert torch.equal(before, after)


@pytest.mark.slow
@pytest.mark.skipif(not triton_available(), reason="triton not installed")
def test_norm_rope_kernels_in_interpreter():
    """The fused kernels inside a tiny Llama (fp32, CPU, TRITON_INTERPRET=1): same logits."""
    script = textwrap.dedent(
        f"""
        import sys, torch
        sys.path.insert(0, {str(REPO)!r}); sys.path.insert(0, {str(REPO / "tests")!r})
        from runtime.kernels import fused_elementwise as fe
        from runtime.kernels.fused_projections import fuse_qkv_and_gate_up
        from test_kernels import tiny_llama
        calls = []
        rms, rope = fe.rms_norm, fe.apply_rope
        fe.rms_norm = lambda *a: calls.append("norm") or rms(*a)
        fe.apply_rope = lambda *a: calls.append("rope") or rope(*a)
        model = tiny_llama(seed=6)
        ids = torch.randint(0, 97, (2, 7))
        with torch.no_grad():
            before = model(ids).logits
            fuse_qkv_and_gate_up(model)
            fe.fuse_norm_and_rope(model)
            after = model(ids).logits
        assert calls.count("norm") == 5 and calls.count("rope") == 2, calls
        torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
        print("ok")
        """
    )
    run_in_triton_interpreter(script)


@pytest.mark.gpu
@needs_cuda
def test_norm_rope_kernels_match_torch_bf16():
    from transformers.models.llama import modeling_llama as ml

    from cbsim.runtime.kernels.fused_elementwise import apply_rope, rms_norm

    torch.manual_seed(0)
    x = torch.randn(32, 1, 4096, device="cuda", dtype=torch.bfloat16) * 3
    norm = ml.LlamaRMSNorm(4096, eps=1e-5).to("cuda", torch.bfloat16)
    norm.weight.data.normal_()
    ref, out = norm(x), rms_norm(x, norm.weight, 1e-5)
    # equal up to the fp32 summation order of the mean: at most one bf16 ulp, on few elements
    assert ((out.float() - ref.float()).abs() <= ref.float().abs() * 2**-7).all()
    assert (out != ref).float().mean() < 0.02
    q = torch.randn(32, 1, 32, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(32, 1, 8, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    cos = torch.randn(32, 1, 128, device="cuda", dtype=torch.bfloat16)
    sin = torch.randn(32, 1, 128, device="cuda", dtype=torch.bfloat16)
    rq, rk = ml.apply_rotary_pos_emb(q, k, cos, sin)
    oq, ok = apply_rope(q, k, cos, sin)
    assert torch.equal(oq, rq) and torch.equal(ok, rk)
