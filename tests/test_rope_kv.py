"""mode.fuse_rope_kv: RoPE of q and k inside the K/V cache write, one kernel where those were two
(runtime/kernels/rope_kv.py), and what the simulator counts and prices for it (cbsim/costs). The
kernel and the runtime run on CUDA (marker gpu); the simulator's side and the recordings here."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from cost_shapes import Shape

from cbsim.config.schema import CbsimConfig
from cbsim.costs import CostModel
from cbsim.costs.kernels import ROPE_KV, elementwise_ops
from cbsim.trace import Trace

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _mode(cfg: CbsimConfig, **kw) -> CbsimConfig:
    return dataclasses.replace(cfg, mode=dataclasses.replace(cfg.mode, **kw))


def test_the_kernel_count_takes_one_more_off_a_layer_with_rope_in_the_kv_write():
    cfg = CbsimConfig()
    assert cfg.mode.rope_in_kv_write()  # today's runtime, and what sim predicts
    layers = cfg.model.num_layers
    decode = Shape([1] * 8, [100] * 8)
    on, off = CostModel(cfg), CostModel(_mode(cfg, fuse_rope_kv=False))
    assert off.step_kernels(decode, True) - on.step_kernels(decode, True) == layers
    # it joins the fused K/V write: without fuse_epilogues (or the rope kernel) it does nothing
    for other in ({"fuse_epilogues": False}, {"fuse_norm_rope": False}):
        a = CostModel(_mode(cfg, **other))
        b = CostModel(_mode(cfg, fuse_rope_kv=False, **other))
        assert a.kernels == b.kernels, other
    # counts taken on a build with it give a build without it one more a layer
    gpu = dataclasses.replace(
        cfg.hardware.gpu, kernels_per_layer=9, kernel_counts_of="fused_rope_kv"
    )
    counted = dataclasses.replace(cfg, hardware=dataclasses.replace(cfg.hardware, gpu=gpu))
    extra = gpu.kernels_extra
    assert CostModel(counted).kernels == 9 * layers + extra
    assert CostModel(_mode(counted, fuse_rope_kv=False)).kernels == 10 * layers + extra
    assert CostModel(_mode(counted, fuse_epilogues=False)).kernels == 14 * layers + extra


def test_the_simulator_prices_the_one_kernel_from_its_row_or_the_two_it_replaced():
    m = CbsimConfig().model
    with_row = [op for op, *_ in elementwise_ops(m, True, True, has=lambda op: True)]
    assert ROPE_KV in with_row and "rope" not in with_row and "kv_write_fused" not in with_row
    without = [op for op, *_ in elementwise_ops(m, True, True, has=lambda op: op != ROPE_KV)]
    assert ROPE_KV not in without and {"rope", "kv_write_fused"} <= set(without)
    # the one kernel moves q's and k's rotation and k and v: its elements per token
    (n,) = [n for op, n, *_ in elementwise_ops(m, True, True) if op == ROPE_KV]
    assert n == (m.num_heads + 2 * m.num_kv_heads) * m.head_dim
    assert ROPE_KV not in [op for op, *_ in elementwise_ops(m, False, True)]


def test_a_recording_says_whether_its_build_rotated_in_the_kv_write(tmp_path):
    """Only a trace that says so (otherData.fused.rope_kv) ran it: every build before the option
    wrote K/V and rotated in two kernels."""
    from cbsim.calibration.recordings import Recorded

    run = {"mode": {"name": "runtime"}, "workload": {"batch_size": 2, "num_requests": 2}}
    cases = {
        "old": ({"epilogues": True}, False),
        "said": ({"epilogues": True, "rope_kv": True}, True),
        "said_not": ({"epilogues": True, "rope_kv": False}, False),
    }
    for name, (fused, want) in cases.items():
        d = tmp_path / name
        d.mkdir()
        trace = Trace([], {"config": run, "source": "runtime", "fused": fused})
        rec = Recorded(path=d / "trace_sync.json.gz", trace=trace, root=tmp_path)
        assert rec.config.mode.fuse_rope_kv is want, name


def test_only_an_armed_layer_defers_and_its_attention_takes_it_once():
    """transformers' own forward (generate, another attention function) never arms the
    deferral: q and k come back rotated as transformers' code expects."""
    from cbsim.runtime.kernels import deferred_rope

    q = torch.zeros(1, 4, 3, 8)
    cos, sin = torch.ones(1, 3, 8), torch.zeros(1, 3, 8)
    assert not deferred_rope.defer(q, cos, sin) and deferred_rope.take() is None
    deferred_rope.arm(True)
    try:
        assert not deferred_rope.defer(torch.zeros(2, 4, 3, 8), cos, sin)  # batch 1 only
        assert deferred_rope.defer(q, cos, sin)
        assert not deferred_rope.defer(q, cos, sin)  # one pending rotation at a time
        got = deferred_rope.take()
        assert got[0] is cos and got[1] is sin and deferred_rope.take() is None
        assert deferred_rope.defer(q, cos, sin)
    finally:
        deferred_rope.arm(False)
    assert deferred_rope.take() is None  # disarming drops what was not taken


def test_the_rotary_wrapper_rotates_where_the_kernel_cannot_run_even_when_armed():
    """On a CPU the wrapper falls back to transformers' code, armed or not: the rotation is never
    deferred to a kernel that cannot run."""
    from test_kernels import tiny_llama
    from transformers.models.llama import modeling_llama

    from cbsim.runtime.kernels import deferred_rope
    from cbsim.runtime.kernels.fused_elementwise import fuse_norm_and_rope, unfuse_norm_and_rope

    model = tiny_llama(seed=3)
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)
    cos, sin = torch.randn(1, 3, 8), torch.randn(1, 3, 8)
    want = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    fuse_norm_and_rope(model)
    deferred_rope.arm(True)
    try:
        got = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
        assert deferred_rope.take() is None
    finally:
        deferred_rope.arm(False)
        unfuse_norm_and_rope(model)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
@needs_cuda
def test_the_one_kernel_writes_the_bits_the_two_kernels_wrote():
    from cbsim.runtime.kernels.fused_elementwise import apply_rope
    from cbsim.runtime.kernels.fused_epilogues import kv_write
    from cbsim.runtime.kernels.rope_kv import rope_kv_write

    torch.manual_seed(0)
    hq, hkv, d = 32, 8, 128
    for tokens in (1, 32, 777):
        qkv = torch.randn(1, tokens, (hq + 2 * hkv) * d, device="cuda", dtype=torch.bfloat16)
        q = qkv[..., : hq * d].view(1, tokens, hq, d).transpose(1, 2)  # the layer's views
        k = qkv[..., hq * d : (hq + hkv) * d].view(1, tokens, hkv, d).transpose(1, 2)
        v = qkv[..., (hq + hkv) * d :].view(1, tokens, hkv, d).transpose(1, 2)
        cos, sin = (torch.randn(1, tokens, d, device="cuda", dtype=torch.bfloat16) for _ in "cs")
        slots = torch.randperm(tokens + 100, device="cuda")[:tokens]
        caches = [torch.zeros(tokens + 100, hkv, d, device="cuda", dtype=torch.bfloat16)]
        caches += [torch.zeros_like(caches[0]) for _ in range(3)]
        qa, ka = apply_rope(q, k, cos, sin)
        kv_write(ka[0].transpose(0, 1), v[0].transpose(0, 1), caches[0], caches[1], slots)
        qb, kb = rope_kv_write(q, k, v, (cos, sin), caches[2], caches[3], slots)
        assert torch.equal(qa, qb) and torch.equal(ka, kb), tokens
        assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3]), tokens


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("mixed_graphs", ["full", "buckets", "off"])
def test_the_runtime_gives_the_same_tokens_with_one_kernel_or_two(config_factory, mixed_graphs):
    """Decode graphs, mixed steps in full graphs, piecewise (which rotates before its cut) and
    eager: the same tokens with the rotation in the K/V write as without, sync and async, and
    the trace says which build ran."""
    from test_runtime_gpu import GPU
    from test_runtime_sync import CASES, assert_same_tokens

    from cbsim.runtime.engine import execute

    over = GPU + CASES[sorted(CASES)[0]] + ["mode.attention=triton"]
    over += ["engine.graph_batch_sizes=[1,2,4]", "engine.eager_token_multiple=8"]
    over += [f"engine.mixed_graphs={mixed_graphs}"]
    ref = execute(config_factory(over + ["engine=sync", "mode.fuse_rope_kv=false"]), "sync")
    assert ref.trace.other_data["fused"]["rope_kv"] is False
    for engine in ("sync", "async"):
        res = execute(config_factory(over + [f"engine={engine}"]), engine)
        assert_same_tokens(res, ref.outputs)
        assert res.trace.other_data["fused"]["rope_kv"] is True
