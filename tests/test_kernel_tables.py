"""Kernel tables: read, interpolated (exact at points, monotone between), selected by a profile,
and used by the cost model in place of the roofline only when a profile names one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, make_config
from cost_shapes import Shape

from cbsim.config import ConfigError
from cbsim.config.schema import CbsimConfig, HardwareConfig
from cbsim.costs import CostModel
from cbsim.costs.kernel_table import format_table, load_table
from cbsim.costs.kernels import KernelCosts

H200 = REPO / "cbsim" / "kernel_tables" / "h200"
SHAPE_8B = (32, 128, 8)  # query heads, head dim, kv heads


def table_rows(path: Path) -> list[list[str]]:
    """Every row as op, n, k, g, rows, context, us, launch ("" in a v1 table)."""
    lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]
    return [(ln.split(",") + [""])[:8] for ln in lines[1:]]


def config(table: str | None = str(H200), **model) -> CbsimConfig:
    cfg = CbsimConfig()
    cfg.hardware = dataclasses.replace(cfg.hardware, kernel_table=table)
    if model:
        cfg.model = dataclasses.replace(cfg.model, **model)
    return cfg


def test_the_committed_tables_say_where_they_came_from():
    for name in ("llama3_1b", "llama3_3b", "llama3_8b"):
        text = (H200 / f"{name}.csv").read_text()
        assert "# hardware: NVIDIA H200" in text
        assert "# command: python -m cbsim +experiment=profile_kernels mode=runtime" in text
        assert f"# model: {name}" in text


@pytest.mark.parametrize("name", ["llama3_1b", "llama3_8b"])
def test_interpolation_is_exact_at_every_table_point(name):
    table = load_table(str(H200 / f"{name}.csv"))
    for op, n, k, g, rows, ctx, us, launch in table_rows(H200 / f"{name}.csv"):
        got = table.time_us(op, int(n), int(k), int(g), int(rows), int(ctx), launch=launch)
        assert got == pytest.approx(float(us), rel=1e-9), (op, n, k, g, rows, ctx)


def test_interpolation_is_monotone_between_monotone_points(tmp_path):
    rows = [("gemm", 64, 64, 0, r, 0, t) for r, t in ((1, 10.0), (16, 12.0), (256, 80.0))]
    rows += [
        ("decode_attention", 4, 16, 2, b, c, b * c * 0.01 + 3) for b in (1, 8) for c in (64, 512)
    ]
    path = tmp_path / "t.csv"
    path.write_text(format_table(rows, ["test"]))
    table = load_table(str(path))
    grid = np.geomspace(1, 256, 200)
    times = [table.time_us("gemm", 64, 64, 0, r) for r in grid]
    assert all(b >= a for a, b in zip(times, times[1:]))
    assert 10.0 < table.time_us("gemm", 64, 64, 0, 4) < 12.0
    att = [table.time_us("decode_attention", 4, 16, 2, 3, c) for c in np.geomspace(64, 512, 50)]
    assert all(b >= a for a, b in zip(att, att[1:]))
    by_rows = [table.time_us("decode_attention", 4, 16, 2, b, 200) for b in np.geomspace(1, 8, 50)]
    assert all(b >= a for a, b in zip(by_rows, by_rows[1:]))


def test_past_the_table_time_grows_with_the_work(tmp_path):
    rows = [("gemm", 64, 64, 0, 1, 0, 5.0), ("gemm", 64, 64, 0, 100, 0, 50.0)]
    rows += [
        ("prefill_attention", 4, 16, 2, 1, 100, 20.0),
        ("prefill_attention", 4, 16, 2, 1, 10, 2.0),
    ]
    path = tmp_path / "t.csv"
    path.write_text(format_table(rows, []))
    table = load_table(str(path))
    assert table.time_us("gemm", 64, 64, 0, 400) == pytest.approx(200.0)
    assert table.time_us("gemm", 64, 64, 0, 0.5) == pytest.approx(5.0)  # not below the first
    assert table.time_us("prefill_attention", 4, 16, 2, 1, 200) == pytest.approx(80.0)


def test_a_shape_not_in_the_table_is_scaled_from_the_nearest_by_its_roofline(tmp_path):
    rows = [("gemm", 1024, 1024, 0, r, 0, 10.0 * r**0.5) for r in (1, 64, 4096)]
    path = tmp_path / "t.csv"
    path.write_text(format_table(rows, []))
    table = load_table(str(path))
    rates = {"flops_per_us": 1e6, "bytes_per_us": 1e6}
    # twice the weights, one row: memory-bound, twice the time
    one = table.time_us("gemm", 2048, 1024, 0, 1, **rates)
    assert one == pytest.approx(2 * table.time_us("gemm", 1024, 1024, 0, 1, **rates), rel=0.01)
    assert table.nearest(("gemm", 2048, 1024, 0)) == ("gemm", 1024, 1024, 0, "")


def test_the_70b_shape_is_costed_from_the_8b_kernels():
    """A model no table holds: every GEMM from the nearest shape, scaled; more weights, more time."""
    cfg8 = config()
    cfg70 = config(hidden_size=8192, intermediate_size=28672, num_layers=80, num_heads=64)
    step8 = CostModel(cfg8).forward(Shape([1] * 32, [512] * 32), graph=True, carry_over=False)
    step70 = CostModel(cfg70).forward(Shape([1] * 32, [512] * 32), graph=True, carry_over=False)
    ratio = (step70.linear_us + step70.lm_head_us) / (step8.linear_us + step8.lm_head_us)
    assert 8.0 < ratio < 11.0  # 70B reads about 9.3x the 8B's linear and LM-head weights


def test_an_8b_decode_step_from_the_table_is_near_the_runtime_step():
    """Kernels only, no fitted term: 32 requests at 768 tokens of context; the runtime's async
    decode step at 32 x (256 + 1024) took 5.62-5.64 ms, its forward 5.44 ms
    (an H200 benchmark), of which a few small kernels (index and dtype ops, the
    embedding) and the gaps between kernels are not in the table."""
    f = CostModel(config()).forward(Shape([1] * 32, [768] * 32), graph=True, carry_over=True)
    kernels = f.linear_us + f.lm_head_us + f.attention_us
    assert 5.0e3 < kernels < 5.6e3
    assert 0.7e3 < f.attention_us < 1.2e3


def test_the_defaults_leave_the_roofline_as_it_was():
    assert HardwareConfig().kernel_table is None
    cm = CostModel(CbsimConfig())
    assert cm.kernel_costs is None
    f = cm.forward(Shape([1] * 32, [1] * 32), graph=True, carry_over=False)
    # the roofline's figure for 8B at bs 32 (tests/test_costs.py checks it against the brief)
    assert 5.0e3 < f.linear_us + f.lm_head_us < 8.0e3


def test_prefill_from_the_table_is_the_measured_flash_prefill():
    """One 8K prompt: attention 32 layers x the table's 1802 us (diag_prefill measured 62.4 ms)."""
    cm = CostModel(config())
    f = cm.forward(Shape([8192], [8192], "prefill"), graph=False, carry_over=False)
    assert f.attention_us == pytest.approx(32 * 1802, rel=0.01)


def test_kernel_costs_follow_the_fused_projections():
    fused = KernelCosts(config())
    cfg = config()
    cfg.mode = dataclasses.replace(cfg.mode, fuse_projections=False)
    assert len(fused.layer_gemms) == 4 and len(KernelCosts(cfg).layer_gemms) == 7


def test_a_missing_table_is_a_config_error_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"hardware.kernel_table='nope.csv': no table there"):
        HardwareConfig(kernel_table="nope.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("op,n,k,g,rows,context,us\nconv,1,1,0,1,0,3\n")
    with pytest.raises(ConfigError, match=r"op='conv' is not a kernel"):
        load_table(str(bad))
    bad.write_text("op,n,k,g,rows,context,us\ngemm,1,1,0,1,0,-3\n")
    with pytest.raises(ConfigError, match=r"us finite and > 0"):
        load_table(str(bad))


@pytest.mark.slow  # imports torch and times a grid on the CPU: some seconds on a loaded machine
def test_the_profiler_writes_a_table_the_cost_model_reads(tmp_path):
    """The CPU path of runtime/profile_kernels.py (torch fallbacks, wall-clock timing) on the tiny
    model: every kind written, read back, and enough to cost a forward of that model."""
    pytest.importorskip("torch")
    from cbsim.runtime.profile_kernels import run_profile

    grid = [
        "extra.gemm_rows=[1,8]",
        "extra.decode_batches=[1,4]",
        "extra.decode_contexts=[16,64]",
        "extra.prefill_rows=[1]",
        "extra.prefill_lengths=[8,32]",
        "extra.elementwise_rows=[1,8]",
        "extra.copy_bytes=[64,4096]",
        "extra.lm_head_rows_max=8",
        f"extra.out={tmp_path}",
    ]
    cfg = make_config(["+experiment=profile_kernels", "mode.device=cpu", "model=tiny", *grid])
    got = run_profile(cfg, tmp_path / "run", command="test")
    table = load_table(got["kernel_table"])
    assert {s[0] for s in table.curves} == {
        "gemm", "decode_attention", "prefill_attention", "rms_norm", "rope", "silu_mul", "add",
        "argmax", "kv_write", "h2d", "d2h",
    }  # fmt: skip
    assert any("wall clock on the CPU" in h for h in table.headers)
    cfg.hardware = dataclasses.replace(cfg.hardware, kernel_table=got["kernel_table"])
    f = CostModel(cfg).forward(Shape([1] * 4, [40] * 4), graph=True, carry_over=False)
    assert f.linear_us > 0 and f.attention_us > 0 and f.lm_head_us > 0


def test_a_bad_profiler_setting_names_its_key():
    pytest.importorskip("torch")
    from cbsim.runtime.profile_kernels import ProfileGrid

    with pytest.raises(ConfigError, match=r"extra\.gemm_rows="):
        ProfileGrid.from_extra({"gemm_rows": [0, 4]})
    with pytest.raises(ConfigError, match=r"extra\.kinds: 'fft'"):
        ProfileGrid.from_extra({"kinds": ["fft"]})
    with pytest.raises(ConfigError, match=r"extra\.target_ms="):
        ProfileGrid.from_extra({"target_ms": float("inf")})


def test_copies_come_from_the_table_when_it_timed_them():
    with_table, without = CostModel(config()), CostModel(CbsimConfig())
    assert with_table.h2d_us(1 << 26) == pytest.approx(1222, rel=1e-3)  # 64 MiB at 55 GB/s
    assert with_table.d2h_us(8) == pytest.approx(2.99, rel=1e-3)  # below the first: held
    hw = CbsimConfig().hardware
    assert without.h2d_us(1 << 20) == pytest.approx(
        hw.copy_latency_us + (1 << 20) / hw.h2d_bandwidth * 1e6
    )


@pytest.mark.parametrize("model", ["llama3_1b", "llama3_3b", "llama3_70b"])
def test_the_kernels_profile_simulates_each_model_shape(model):
    """hardware=h200_kernels through Hydra, both engines; 70B has no table of its own."""
    from cbsim.metrics import compute_metrics
    from cbsim.sim import run

    small = ["workload.batch_size=8", "workload.prompt_len=64", "workload.gen_len=16"]
    cfg = make_config(["hardware=h200", f"model={model}", *small])
    assert cfg.hardware.kernel_table == "cbsim/kernel_tables/h200"
    sync, async_ = (compute_metrics(run(cfg, e)) for e in ("sync", "async"))
    assert 0 < async_["total_time_s"] <= sync["total_time_s"]


def test_a_step_is_costed_at_the_launch_its_rule_picks(tmp_path):
    """A v2 table times decode attention per launch: the cost model looks up the launch the
    rule picks over the step's table (one partition at 32 requests, 128-token partitions at
    one request of the 8B shape's 8 kv heads), and below a split launch's first timed context
    charges the one-partition kernel plus the split's overhead measured there."""
    from cbsim.costs.kernels import KernelCosts

    rows: list[tuple] = []
    att = [(b, c, "t128", 1.0 * c) for b in (1, 32) for c in (128, 256, 512)]
    att += [(b, c, "t128p128", 0.5 * c + 10.0) for b in (1, 32) for c in (128, 256, 512)]
    att += [(b, c, "t128p256", 1.0 * c + 20.0) for b in (1, 32) for c in (256, 512)]
    rows += [("decode_attention", 32, 128, 8, b, c, us, name) for b, c, name, us in att]
    path = tmp_path / "t.csv"
    path.write_text(format_table(rows, ["test"]))
    cfg = config(str(path))
    cfg.workload = type(cfg.workload)(prompt_len=256, gen_len=256)  # a 512-token table
    cm = CostModel(cfg)
    kc = KernelCosts(cfg)
    one = Shape([1], [512])
    assert cm.decode_launch(one, padded=1) == "t128p128"
    assert cm.decode_launch(Shape([1] * 32, [512] * 32), padded=32) == "t128"
    layers = cfg.model.num_layers
    assert kc.decode_attention_us(1, 512, "t128p128") == pytest.approx(layers * 266.0)
    # 200 tokens in 256-token partitions: the one-partition kernel + (276 - 256) at 256
    assert kc.decode_attention_us(1, 200, "t128p256") == pytest.approx(layers * (200.0 + 20.0))
