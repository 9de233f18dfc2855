"""mode.skinny_gemm: decode's few-row GEMMs in one Triton kernel (runtime/kernels/skinny_gemm.py).

The kernel against a float64 product, with and without the residual added into its buffer, at
row counts that fill, split and pad the row tile: under TRITON_INTERPRET=1 where triton is
installed (fp16: the interpreter has no bf16 dot), and bf16 on CUDA inside a captured graph
(marker `gpu`). The launch rule; the simulator pricing the decode graphs' layer GEMMs from the
table's ``triton`` rows up to max_rows, as the runtime runs them; a recording saying it ran them.
"""

from __future__ import annotations

import dataclasses
import textwrap

import pytest
import torch
from conftest import run_in_triton_interpreter

from cbsim.config import ConfigError
from cbsim.config.schema import CbsimConfig
from cbsim.config.skinny_gemm import SkinnyGemmConfig
from cbsim.runtime.kernels.paged_attention import triton_available
from cbsim.runtime.kernels.skinny_gemm import SkinnyLaunch, SkinnyRule, block_m, skinny_ok


def test_the_rule_takes_the_widest_tile_that_still_fills_the_sms():
    rule = SkinnyRule.of(SkinnyGemmConfig(enabled=True), sms=132)
    assert rule.launch(28672, 4096).block_n == 64  # 448 programs
    assert rule.launch(6144, 4096).block_n == 32  # 192; 64 would give 96
    assert rule.launch(2048, 8192).block_n == 16  # 128 programs: the narrowest
    assert rule.launch(4112, 4096).block_n == 16  # 16 x 257: only 16 divides
    assert rule.launch(4100, 4096) is None  # no tile divides
    assert rule.launch(4096, 4000) is None  # K off the block
    two = SkinnyRule.of(SkinnyGemmConfig(enabled=True, programs_per_sm=2), sms=132)
    assert two.launch(28672, 4096).block_n == 64 and two.launch(6144, 4096).block_n == 16


@pytest.mark.parametrize(
    "key,value,allowed",
    [("max_rows", 0, "1 to 128"), ("block_k", 100, "32, 64, 128, 256"), ("warps", 3, "1, 2, 4, 8")],
)
def test_a_bad_value_names_its_key_and_what_is_allowed(key, value, allowed):
    with pytest.raises(ConfigError, match=rf"mode.skinny_gemm.{key}={value}.*{allowed}"):
        SkinnyGemmConfig(**{key: value})


def _costs(tmp_path, **skinny):
    """The 8B's layer GEMMs at 4 us x rows on cuBLAS, 3 on cuBLASLt, 2 on the kernel up to 64
    rows; the elementwise kernels 1 us."""
    from cbsim.costs.kernel_table import format_table
    from cbsim.costs.kernels import KernelCosts, elementwise_ops

    cfg = CbsimConfig()
    m = cfg.model
    h, q, kv = m.hidden_size, m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    layer = [(q + 2 * kv, h), (h, q), (2 * m.intermediate_size, h), (h, m.intermediate_size)]
    rows = []
    for n, k in [*layer, (m.vocab_size, h)]:
        for r in (1, 32, 256):
            rows.append(("gemm", n, k, 0, r, 0, 4.0 * r))
            rows.append(("gemm", n, k, 0, r, 0, 3.0 * r, "cublaslt"))
    rows += [("gemm", n, k, 0, r, 0, 2.0 * r, "triton") for n, k in layer for r in (1, 32, 64)]
    for op, n, k, _ in elementwise_ops(m, cfg.mode.fuse_epilogues):
        rows += [(op, n, k, 0, r, 0, 1.0) for r in (1, 32, 256)]
    rows += [("argmax_split", m.vocab_size, 0, 0, r, 0, 5.0) for r in (1, 32, 256)]
    path = tmp_path / "t.csv"
    path.write_text(format_table(rows, ["test"]))
    cfg.hardware = dataclasses.replace(cfg.hardware, kernel_table=str(path))
    sk = SkinnyGemmConfig(**skinny)
    cfg.mode = dataclasses.replace(cfg.mode, blas="cublas", graph_blas="cublaslt", skinny_gemm=sk)
    return KernelCosts(cfg), 4 * m.num_layers


def test_the_simulator_prices_the_graphs_layer_gemms_on_the_kernel_up_to_max_rows(tmp_path):
    on, gemms = _costs(tmp_path, enabled=True, max_rows=64)
    off, _ = _costs(tmp_path, enabled=False)
    assert off.linear_us(32, graph=True) - on.linear_us(32, graph=True) == pytest.approx(
        gemms * (3.0 - 2.0) * 32
    )
    assert on.linear_us(32) == off.linear_us(32)  # eager steps keep mode.blas
    assert on.linear_us(128, graph=True) == off.linear_us(128, graph=True)  # past max_rows
    assert on.lm_head_us(32, graph=True) == off.lm_head_us(32, graph=True)  # the LM head too


def test_the_row_tile_is_a_power_of_two_between_16_and_128():
    assert [block_m(r) for r in (1, 16, 17, 33, 100, 128, 129, 500)] == [
        16, 16, 32, 64, 128, 128, 128, 128,
    ]  # fmt: skip


def test_calls_the_kernel_cannot_take_are_left_to_torch():
    launch = SkinnyLaunch(block_n=32, block_k=128)
    w = torch.zeros(64, 256, dtype=torch.bfloat16)
    x = torch.zeros(4, 256, dtype=torch.bfloat16)
    assert not skinny_ok(x, w, launch, 128)  # a CPU tensor, not interpreted
    assert not skinny_ok(x.cuda() if torch.cuda.is_available() else x, w[:40], launch, 128)


SCRIPT = """
import torch
from cbsim.runtime.kernels.skinny_gemm import SkinnyLaunch, skinny_linear, skinny_ok
torch.manual_seed(0)
for rows, launch in ((1, SkinnyLaunch(32, 64, 2, 4)), (16, SkinnyLaunch(16, 128, 3, 4)),
                     (37, SkinnyLaunch(32, 64, 2, 4)), (150, SkinnyLaunch(64, 64, 2, 4))):
    x = torch.randn(1, rows, 256, dtype=torch.float16)
    w = (torch.randn(128, 256) * 0.05).to(torch.float16)
    assert skinny_ok(x, w, launch, 256)
    ref = x[0].double() @ w.double().T
    y = skinny_linear(x, w, launch)
    assert y.shape == (1, rows, 128), y.shape
    assert (y[0].double() - ref).abs().max() < 2e-3 * ref.abs().max(), rows
    r = torch.randn(rows, 128, dtype=torch.float16)
    want = r.double() + ref
    got = skinny_linear(x, w, launch, residual=r)
    assert got.data_ptr() == r.data_ptr()
    assert (r.double() - want).abs().max() < 4e-3 * want.abs().max(), rows
print("ok")
"""


@pytest.mark.skipif(not triton_available(), reason="needs triton")
def test_kernel_in_interpreter_matches_float64():
    run_in_triton_interpreter(textwrap.dedent(SCRIPT))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows", [8, 32, 128])
def test_kernel_on_cuda_in_a_graph_matches_cublas(rows):
    """bf16, the 8B's o shape: captured once, replayed over new inputs, residual added in place."""
    from cbsim.runtime.kernels.skinny_gemm import skinny_linear

    launch = SkinnyLaunch()
    g = torch.Generator(device="cuda").manual_seed(rows)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    x = torch.empty(rows, 4096, device="cuda", dtype=torch.bfloat16)
    r = torch.empty(rows, 4096, device="cuda", dtype=torch.bfloat16)
    x.normal_(generator=g)
    r.normal_(generator=g)
    skinny_linear(x, w, launch, residual=r.clone())  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = skinny_linear(x, w, launch)
        skinny_linear(x, w, launch, residual=r)
    for _ in range(2):
        x.normal_(generator=g)
        r.normal_(generator=g)
        r0 = r.clone()
        graph.replay()
        torch.cuda.synchronize()
        ref = x.double() @ w.double().T
        assert (y.double() - ref).abs().max() < 1e-2 * ref.abs().max()
        want = r0.double() + ref
        assert (r.double() - want).abs().max() < 1e-2 * want.abs().max()
