"""The datasheet tier: profiles of GPUs nobody profiled, from a profiled GPU's profile and the
two datasheets, labelled as such, with their kernel tables scaled and their bands widened.

The profiled GPU here is small and made up: the shipped h100 preset with a measured-looking
copy rate (3.03 TB/s of the datasheet's 3.35, as the brief measured) and a kernel table of a few
rows of the shipped H200 1B table.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, make_config

from cbsim.calibration.run_config import hardware_from
from cbsim.config import ConfigError
from cbsim.config.hardware import HardwareConfig
from cbsim.costs.kernel_table import load_table
from cbsim.metrics import compute_metrics
from cbsim.profiling.datasheet import load_datasheets, run_datasheet_task, tier_error_of
from cbsim.sim import run

H200_1B = REPO / "cbsim" / "kernel_tables" / "h200" / "llama3_1b.csv"


def small_table(folder: Path) -> Path:
    """A few ops of the shipped 1B table: every gemm, norm and copy row, nothing else."""
    lines = H200_1B.read_text().splitlines()
    keep = [ln for ln in lines if ln.startswith(("#", "op,", "h2d", "d2h", "rms_norm", "gemm"))]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "llama3_1b.csv").write_text("\n".join(keep) + "\n")
    return folder


def profiles(tmp_path: Path, *extra: str) -> dict:
    table = small_table(tmp_path / "h100_tables")
    cfg = make_config(
        [
            "+experiment=datasheet_profiles",
            "hardware=h100",
            "hardware.tier=profiled",  # as profile_machine would write an H100's
            "hardware.hbm_bandwidth=3.03e12",
            f"hardware.kernel_table={table}",
            f"extra.out={tmp_path / 'out'}",
            *extra,
        ]
    )
    return cfg, run_datasheet_task(cfg, tmp_path, "test")


def written(path: str) -> HardwareConfig:
    """A written profile as hardware=<its directory> reads it: its tables under the directory."""
    root = Path(path).parents[1]
    assert Path(path).parent.name == "hardware" and (root / "manifest.yaml").is_file()
    raw = yaml.safe_load(Path(path).read_text())
    if raw.get("kernel_table"):
        raw["kernel_table"] = str(root / raw["kernel_table"])
    return hardware_from(raw)


def test_every_datasheet_has_its_numbers_and_a_source():
    sheets = load_datasheets()
    assert {"a100_80gb_sxm", "l40s", "b200", "h100", "h200"} <= set(sheets)
    for s in sheets.values():
        assert "datasheet" in s.source.lower() and s.memory_bandwidth < 1e13
    assert sheets["h100"].memory_bandwidth == 3.35e12 and sheets["h200"].memory_bandwidth == 4.8e12


def test_unprofiled_gpus_get_their_datasheet_at_the_profiled_share(tmp_path):
    cfg, out = profiles(tmp_path)
    assert out["profiled"] == "h100" and len(out["profiles"]) == 4
    sheets = load_datasheets()
    share = 3.03e12 / 3.35e12
    for path in out["profiles"]:
        hw = written(path)  # a profile the schema reads
        key = hw.name.removesuffix("_datasheet")
        assert hw.tier == "datasheet" and "not profiled" in hw.source
        assert "NOT PROFILED" in Path(path).read_text().splitlines()[0]
        assert hw.hbm_bandwidth == pytest.approx(sheets[key].memory_bandwidth * share)
        assert hw.memory_bytes == sheets[key].memory_bytes
        # host and efficiencies are the profiled machine's
        assert hw.host == cfg.hardware.host and hw.gpu == cfg.hardware.gpu
        # the bands widen: the tier's error in quadrature
        assert hw.model_error.total_time == pytest.approx(
            math.hypot(cfg.hardware.model_error.total_time, 0.05)
        )


def test_kernel_tables_scale_by_each_kernels_roofline_ratio_but_copies_stay(tmp_path):
    """A decode GEMM reads its weights at the other memory's rate; a prompt's GEMM computes at
    the other tensor cores' (an A100 has 0.61 of an H100's bandwidth and 0.32 of its FLOP/s);
    the table's shortest kernel, a node's launch and latency, is kept."""
    _, out = profiles(tmp_path, "extra.gpus=[a100_80gb_sxm]")
    (path,) = out["profiles"]
    hw = written(path)
    tables = Path(hw.kernel_table)
    load_table(tables)  # a table the simulator reads
    a = pd.read_csv(tmp_path / "h100_tables" / "llama3_1b.csv", comment="#")
    b = pd.read_csv(tables / "llama3_1b.csv", comment="#")
    sheets = load_datasheets()
    h100, a100 = sheets["h100"], sheets["a100_80gb_sxm"]
    memory = h100.memory_bandwidth / a100.memory_bandwidth
    compute = h100.bf16_dense_flops / a100.bf16_dense_flops
    gemm, copies = a.op == "gemm", a.op.isin(["h2d", "d2h"])
    assert gemm.sum() > 10 and copies.sum() > 2
    floor = a.us[~copies].min()  # launch and latency: the same on either GPU
    ratio = ((b.us - floor) / (a.us - floor))[gemm & (a.us > floor)]
    rows = a.rows[ratio.index]
    assert ratio[rows == 1].to_numpy() == pytest.approx(memory, rel=5e-3)  # reads weights
    assert ratio[rows >= 8192].to_numpy() == pytest.approx(compute, rel=5e-3)  # computes
    assert ((ratio >= memory * (1 - 5e-3)) & (ratio <= compute * (1 + 5e-3))).all()
    for _, shape in a[gemm].groupby(["n", "k"]):  # more rows of one GEMM: more compute-bound
        r = ((b.us - floor) / (a.us - floor))[shape.sort_values("rows").index].to_numpy()
        assert (r[1:] >= r[:-1] * (1 - 5e-3)).all() and r[-1] > r[0]
    norms = (a.op == "rms_norm") & (a.us > floor + 1.0)
    assert norms.sum() > 2
    want = floor + (a.us[norms] - floor) * memory
    assert b.us[norms].to_numpy() == pytest.approx(want.to_numpy(), rel=2e-3)
    assert b.us[~copies].min() == pytest.approx(floor, rel=1e-3)  # the floor is not moved
    assert (b.us[copies] == a.us[copies]).all()
    assert "not profiled" in (tables / "llama3_1b.csv").read_text()


def test_a_slower_memory_predicts_a_slower_decode(tmp_path):
    cfg, out = profiles(tmp_path, "extra.gpus=[a100_80gb_sxm,b200]")
    small = make_config(["model=llama3_1b", "workload.batch_size=8", "workload.gen_len=16"])
    times = {}
    for path in out["profiles"]:
        hw = written(path)
        hw = dataclasses.replace(hw, kernel_table=None)  # the roofline: the datasheet rates
        times[hw.name] = compute_metrics(run(dataclasses.replace(small, hardware=hw), "sync"))
    a, b = times["a100_80gb_sxm_datasheet"], times["b200_datasheet"]
    assert a["total_time_s"] > b["total_time_s"]


def test_a_rate_above_the_datasheet_is_held_to_it(tmp_path):
    _, out = profiles(tmp_path, "hardware.hbm_bandwidth=4.0e12", "extra.gpus=[l40s]")
    assert any("above the datasheet" in n for n in out["notes"])
    hw = written(out["profiles"][0])
    assert hw.hbm_bandwidth == pytest.approx(8.64e11)  # share 1, never above


def test_a_profile_without_kernel_tables_gives_profiles_on_the_roofline(tmp_path):
    cfg = make_config(
        [
            "+experiment=datasheet_profiles",
            "hardware=h200",
            "hardware.kernel_table=null",
            f"extra.out={tmp_path / 'new'}",
        ]
    )
    out = run_datasheet_task(cfg, tmp_path, "test")
    hw = written(out["profiles"][0])
    assert hw.kernel_table is None and hw.tier == "datasheet"


def test_a_datasheet_profile_never_starts_from_another_unmeasured_one(tmp_path):
    cfg = make_config(["+experiment=datasheet_profiles", "hardware=h100"])
    with pytest.raises(ConfigError, match="hardware=h100 is tier datasheet"):
        run_datasheet_task(cfg, tmp_path, "test")


def test_wrong_settings_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="extra.gpus: 'a100' has no datasheet"):
        profiles(tmp_path, "extra.gpus=[a100]")
    with pytest.raises(ConfigError, match="extra.tier_error="):
        tier_error_of({"total": 0.1})
    with pytest.raises(
        ConfigError,
        match="hardware.tier=guess is not an option; allowed: profiled, fitted, datasheet",
    ):
        make_config(["hardware.tier=guess"])


SHIPPED = REPO / "cbsim" / "profiles"


@pytest.mark.parametrize("gpu", ["a100_80gb_sxm", "l40s", "b200"])
def test_a_shipped_datasheet_profile_is_what_the_command_writes_from_the_profiled_h200(
    gpu, tmp_path
):
    """What ships is reproducible: the command on the shipped H200 profile writes the shipped
    datasheet profile, file for file, and hardware=auto on that card finds it."""
    from cbsim.profiling.select import auto_profile, rewrite

    cfg = make_config(
        rewrite(["+experiment=datasheet_profiles", "hardware=h200_profiled"])
        + [f"extra.gpus=[{gpu}]", f"extra.out={tmp_path}"]
    )
    run_datasheet_task(cfg, tmp_path, "cmd")
    name = f"{gpu}_datasheet"
    made, shipped = tmp_path / name, SHIPPED / name
    files = sorted(p.relative_to(shipped) for p in shipped.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(made) for p in made.rglob("*") if p.is_file())
    command = yaml.safe_load((shipped / "manifest.yaml").read_text())["command"]
    for rel in files:
        if rel.name == "manifest.yaml":
            got, want = (yaml.safe_load((d / rel).read_text()) for d in (made, shipped))
            assert {**got, "command": command} == want
            continue
        want = (shipped / rel).read_text().replace(command, "cmd")
        assert (made / rel).read_text() == want, rel
    sheet = load_datasheets()[gpu]
    found = auto_profile(sheet.device_name)
    assert found.name == name and found.tier == "datasheet"
