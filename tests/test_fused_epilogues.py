"""mode.fuse_epilogues: the residual adds inside the o_proj and down GEMMs, SiLU x up and the K/V
write as one Triton kernel each (runtime/kernels/fused_epilogues.py), and what the simulator counts
for it (cbsim/costs). The kernels run on CUDA (marker gpu); the residual GEMM and the fallbacks
run here."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from cost_shapes import Shape
from test_kernels import tiny_llama

from cbsim.config.schema import CbsimConfig
from cbsim.costs import CostModel
from cbsim.costs.kernels import KernelCosts, elementwise_ops
from cbsim.runtime.kernels.fused_epilogues import fuse_epilogues, unfuse_epilogues
from cbsim.runtime.kernels.fused_projections import fuse_qkv_and_gate_up
from cbsim.trace import Trace

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_fused_layers_give_the_same_logits_in_fp32():
    model = tiny_llama(seed=7)
    ids = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        before = model(ids).logits
        fuse_qkv_and_gate_up(model)
        counts = fuse_epilogues(model)
        after = model(ids).logits  # the residual GEMM here; SiLU x up falls back to torch
        assert counts == {"layers": 2, "mlps": 2}
        assert fuse_epilogues(model) == {"layers": 0, "mlps": 0}  # idempotent
        unfuse_epilogues(model)
        again = model(ids).logits
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again, before, rtol=1e-6, atol=1e-6)
    assert not any("cbsim_residual" in m.__dict__ for m in model.modules())


def test_a_recording_says_what_its_build_fused(tmp_path):
    """A runtime trace's config is its command line: what the build fused comes from the trace
    (otherData.fused) or, for traces that do not say, from the manifest beside it (default: not
    fused, as every build before the option ran)."""
    from cbsim.calibration.recordings import Recorded

    run = {"mode": {"name": "runtime"}, "workload": {"batch_size": 2, "num_requests": 2}}
    base = {"config": run, "source": "runtime"}
    cases = {
        "old": ({}, None, False),
        "said": ({"fused": {"epilogues": True}}, None, True),
        "manifest": ({}, "fused_epilogues: true\n", True),
        "said_over_manifest": ({"fused": {"epilogues": False}}, "fused_epilogues: true\n", False),
    }
    for name, (other, manifest, want) in cases.items():
        d = tmp_path / name
        d.mkdir()
        if manifest:
            (d / "manifest.yaml").write_text(manifest)
        trace = Trace([], {**base, **other})
        rec = Recorded(path=d / "trace_sync.json.gz", trace=trace, root=tmp_path)
        assert rec.config.mode.fuse_epilogues is want, name
    assert CbsimConfig().mode.fuse_epilogues is True  # today's runtime, and what sim predicts


def _kernel_costs(fused: bool) -> KernelCosts:
    cfg = CbsimConfig()
    cfg.mode.fuse_epilogues = fused
    cfg.hardware.kernel_table = "cbsim/kernel_tables/h200"
    return KernelCosts(cfg)


def test_the_simulator_drops_the_adds_and_takes_the_fused_rows():
    m = CbsimConfig().model
    plain = [op for op, *_ in elementwise_ops(m, False)]
    fused = [op for op, *_ in elementwise_ops(m, True)]
    assert "add" in plain and "add" not in fused
    assert {"silu_mul_fused", "kv_write_fused"} <= set(fused)
    on, off = _kernel_costs(True), _kernel_costs(False)
    ops = {op for op, *_ in on.elementwise}
    # the committed table's rows name the fused kernels, or the unfused ones stand in for them
    assert ops <= {op for op in (*fused, "silu_mul", "kv_write") if on.table.has(op)}
    assert on.linear_us(32) < off.linear_us(32)


def test_the_kernel_count_follows_the_build():
    cfg = CbsimConfig()
    cfg.mode.fuse_rope_kv = False  # its one kernel more: tests/test_rope_kv.py
    cfg.hardware.gpu = dataclasses.replace(cfg.hardware.gpu, decode_kernels_per_layer=3)
    unfused = CostModel(
        dataclasses.replace(cfg, mode=dataclasses.replace(cfg.mode, fuse_epilogues=False))
    )
    fused = CostModel(cfg)
    decode = Shape([1] * 8, [100] * 8)
    prompt = Shape([64], [64], "prefill")
    layers = cfg.model.num_layers
    assert unfused.step_kernels(decode, True) - fused.step_kernels(decode, True) == 4 * layers
    assert unfused.step_kernels(prompt, False) - fused.step_kernels(prompt, False) == 4 * layers
    # counts taken on the fused build give the unfused one 4 more; another engine's stay as they are
    gpu = cfg.hardware.gpu
    for counted, fused_n, unfused_n in (("fused", 10, 14), ("engine", 14, 14)):
        cfg.hardware.gpu = dataclasses.replace(
            gpu, kernels_per_layer=10 if counted == "fused" else 14, kernel_counts_of=counted
        )
        for on, want in ((True, fused_n), (False, unfused_n)):
            m = dataclasses.replace(cfg.mode, fuse_epilogues=on)
            cm = CostModel(dataclasses.replace(cfg, mode=m))
            assert cm.kernels == want * layers + gpu.kernels_extra, (counted, on)


@pytest.mark.gpu
@needs_cuda
def test_silu_mul_and_kv_write_kernels_match_torch():
    import torch.nn.functional as F

    from cbsim.runtime.kernels.fused_epilogues import kv_write, silu_mul

    torch.manual_seed(0)
    for rows in (1, 32, 1000):
        gu = torch.randn(rows, 2 * 14336, device="cuda", dtype=torch.bfloat16) * 4
        ref = F.silu(gu[:, :14336]) * gu[:, 14336:]
        out = silu_mul(gu)
        # torch's exp and Triton's differ in the last float bits: a rare bf16 ulp
        assert ((out.float() - ref.float()).abs() <= ref.float().abs() * 2**-7 + 1e-30).all()
        assert (out != ref).float().mean() < 0.01
    qkv = torch.randn(48, (32 + 16) * 128, device="cuda", dtype=torch.bfloat16)
    key = qkv[:, 4096:5120].view(48, 8, 128)  # strided, as the layer's views are
    value = qkv[:, 5120:].view(48, 8, 128)
    slots = torch.randperm(200, device="cuda")[:48]
    kc, vc = (torch.zeros(200, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    rk, rv = kc.clone().index_copy_(0, slots, key), vc.clone().index_copy_(0, slots, value)
    kv_write(key, value, kc, vc, slots)
    assert torch.equal(kc, rk) and torch.equal(vc, rv)


@pytest.mark.gpu
@needs_cuda
def test_fused_bf16_layers_stay_near_the_unfused_ones():
    from cbsim.runtime.kernels.fused_elementwise import fuse_norm_and_rope, unfuse_norm_and_rope

    model = tiny_llama(seed=8).to("cuda", torch.bfloat16)
    ids = torch.randint(0, 97, (4, 16), device="cuda")
    with torch.no_grad():
        fuse_qkv_and_gate_up(model)
        fuse_norm_and_rope(model)
        try:
            before = model(ids).logits.float()
            fuse_epilogues(model)
            after = model(ids).logits.float()
        finally:
            unfuse_epilogues(model)
            unfuse_norm_and_rope(model)
    rel = (after - before).norm() / before.norm()
    assert rel < 2e-2, rel  # one bf16 rounding fewer per residual sum
