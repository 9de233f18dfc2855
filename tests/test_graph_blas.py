"""mode.graph_blas and mode.split_argmax: a table's GEMM rows per BLAS library and its two-stage
argmax rows, priced where the runtime runs them (the decode graphs on graph_blas, eager steps
on blas), and bad values refused with the key named."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import make_config

from cbsim.config import ConfigError
from cbsim.config.schema import CbsimConfig, ModeConfig
from cbsim.costs.kernel_table import format_table, load_table
from cbsim.costs.kernels import KernelCosts, elementwise_ops


def _table(tmp_path, extra_headers=()) -> str:
    """Every GEMM of the 8B shape at 4 us x rows on the table's library, 3 us x rows on cuBLASLt;
    the elementwise kernels 1 us; torch's argmax 27 us, the split one 5 us."""
    cfg = CbsimConfig()
    m = cfg.model
    h, q, kv = m.hidden_size, m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    shapes = [(q + 2 * kv, h), (h, q), (2 * m.intermediate_size, h), (h, m.intermediate_size)]
    shapes.append((m.vocab_size, h))
    rows = []
    for n, k in shapes:
        for r in (1, 32, 1024):
            rows.append(("gemm", n, k, 0, r, 0, 4.0 * r))
            rows.append(("gemm", n, k, 0, r, 0, 3.0 * r, "cublaslt"))
    for op, n, k, _ in elementwise_ops(m, cfg.mode.fuse_epilogues):
        rows += [(op, n, k, 0, r, 0, 1.0) for r in (1, 32, 1024)]
    for r in (1, 32, 1024):
        rows.append(("argmax", m.vocab_size, 0, 0, r, 0, 27.0))
        rows.append(("argmax_split", m.vocab_size, 0, 0, r, 0, 5.0))
    path = tmp_path / "t.csv"
    path.write_text(format_table(rows, ["test", *extra_headers]))
    return str(path)


def _costs(table: str, **mode) -> KernelCosts:
    cfg = CbsimConfig()
    cfg.hardware = dataclasses.replace(cfg.hardware, kernel_table=table)
    cfg.mode = dataclasses.replace(cfg.mode, **mode)
    return KernelCosts(cfg)


def test_a_graph_steps_gemms_come_from_the_graph_librarys_rows(tmp_path):
    table = _table(tmp_path)
    kc = _costs(table, blas="cublas", graph_blas="cublaslt", split_argmax=True)
    gemms = 4 * CbsimConfig().model.num_layers  # qkv, o, gate_up, down per layer
    eager, graph = kc.linear_us(32), kc.linear_us(32, graph=True)
    assert eager - graph == pytest.approx(gemms * (4.0 - 3.0) * 32)
    assert kc.lm_head_us(32) - kc.lm_head_us(32, graph=True) == pytest.approx(32.0)
    assert kc.lm_head_us(32) == pytest.approx(4.0 * 32 + 5.0)  # the split argmax's row
    same = _costs(table, blas="cublas", graph_blas="cublas", split_argmax=False)
    assert same.linear_us(32, graph=True) == pytest.approx(eager)
    assert same.lm_head_us(32) == pytest.approx(4.0 * 32 + 27.0)


def test_a_table_profiled_on_cublaslt_prices_cublas_from_its_other_rows(tmp_path):
    """The rows without a launch are the header's library; a library the table did not time
    falls back to them."""
    table = _table(tmp_path, ["blas: cublaslt"])
    assert load_table(table).blas == "cublaslt"
    kc = _costs(table, blas="cublaslt", graph_blas="cublaslt")
    assert kc.linear_us(32) == kc.linear_us(32, graph=True)
    other = _costs(table, blas="cublas", graph_blas="cublaslt")
    assert other.gemm_launch == {False: "cublas", True: ""}
    assert load_table(_table(tmp_path)).blas == "cublas"  # no header line: torch's default


@pytest.mark.parametrize(
    "row,message",
    [
        ("gemm,4096,4096,0,1,0,3.0,openblas", r"launch='openblas'.*allowed: cublas, cublaslt"),
        ("rms_norm,4096,0,0,1,0,3.0,cublaslt", r"only gemm and decode_attention rows name one"),
        ("decode_attention,32,128,8,1,128,3.0,cublaslt", r"t<tile> or t<tile>p<partition>"),
    ],
)
def test_a_bad_launch_is_refused_with_its_reason(tmp_path, row, message):
    path = tmp_path / "bad.csv"
    path.write_text("# test\nop,n,k,g,rows,context,us,launch\n" + row + "\n")
    with pytest.raises(ConfigError, match=message):
        load_table(str(path))


@pytest.mark.parametrize("key", ["blas", "graph_blas"])
def test_a_bad_library_names_its_key_and_what_is_allowed(key):
    with pytest.raises(ConfigError, match=rf"mode.{key}.*cublas, cublaslt"):
        ModeConfig(**{key: "openblas"})


def test_the_defaults_capture_graphs_on_cublaslt_and_split_the_argmax():
    mode = make_config([]).mode
    assert (mode.blas, mode.graph_blas, mode.split_argmax) == ("cublas", "cublaslt", True)
