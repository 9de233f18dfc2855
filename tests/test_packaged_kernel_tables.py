"""The kernel tables shipped as package data: the same files as the tables they copy, and the
default profile reads them wherever cbsim runs from."""

from __future__ import annotations

import filecmp

from conftest import REPO, make_config

from cbsim.config.hardware import kernel_table_files

PACKAGED = REPO / "cbsim" / "kernel_tables"
SOURCE = REPO / "experiments" / "kernels"


def test_the_packaged_tables_equal_the_tables_they_copy():
    shipped = sorted(p.relative_to(PACKAGED) for p in PACKAGED.glob("*/*") if p.is_file())
    assert shipped, "no packaged kernel tables"
    for rel in shipped:
        assert filecmp.cmp(PACKAGED / rel, SOURCE / rel, shallow=False), rel
    for table in {rel.parts[0] for rel in shipped}:
        assert {p.name for p in (SOURCE / table).glob("*.csv")} <= {
            rel.name for rel in shipped if rel.parts[0] == table
        }


def test_the_default_profile_reads_the_packaged_tables_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no checkout here: the path resolves against the install
    hw = make_config([]).hardware
    assert hw.name == "h200"
    files = kernel_table_files(hw.kernel_table)
    assert [f.parent for f in files] == [PACKAGED / "h200"] * 3
    assert {f.name for f in files} == {"llama3_1b.csv", "llama3_3b.csv", "llama3_8b.csv"}
    # the default is a fitted profile with its held-out error, not the first estimates
    assert hw.source.startswith("calibrated from") and hw.model_error.speedup > 0
    assert make_config(["hardware=h200_estimates"]).hardware.model_error.speedup == 0
