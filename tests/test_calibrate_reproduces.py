"""The shipped default profile (conf/hardware/h200.yaml) is what `python -m cbsim
+experiment=calibrate` writes: every value has a provenance entry, the fitted ones name their fit,
the others come from the unfitted start (h200_estimates) unchanged, physical rates stay as
measured, and the parts of the fit cheap enough to repeat here (the copies, the uneven share)
give the shipped values again. The whole command takes many minutes; it is not re-run here."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from conftest import RECORDINGS, REPO

from cbsim.api import compose
from cbsim.calibration.host import fit_copies
from cbsim.calibration.recordings import label, load, recordings_root, resolve_traces
from cbsim.calibration.result import Calibration
from cbsim.calibration.uneven import measure_uneven_share

PROFILE = REPO / "conf" / "hardware" / "h200.yaml"
CALIBRATE = REPO / "conf" / "experiment" / "calibrate.yaml"
EFFICIENCIES = (
    "gemm_bandwidth_eff",
    "gemm_flops_eff",
    "attention_bandwidth_eff",
    "attention_flops_eff",
)


def leaves(obj, path: str = "") -> dict[str, object]:
    """Dotted key -> value of every field of a profile, nested groups walked."""
    out: dict[str, object] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out.update(leaves(value, f"{path}{f.name}."))
        else:
            out[path + f.name] = value
    return out


@pytest.fixture(scope="module")
def shipped():
    return compose("hardware=h200").hardware


@pytest.fixture(scope="module")
def start():
    return compose("hardware=h200_estimates").hardware


@pytest.fixture(scope="module")
def fit_set():
    """The traces +experiment=calibrate fits by default, as its config names them."""
    root = recordings_root(str(RECORDINGS))
    patterns = yaml.safe_load(CALIBRATE.read_text())["trace"]
    return load(resolve_traces(patterns, root), root)


def test_the_default_profile_is_the_calibrate_commands_output(shipped):
    text = PROFILE.read_text()
    assert "written by `python -m cbsim +experiment=calibrate` from hardware=h200_estimates" in text
    config = yaml.safe_load(CALIBRATE.read_text())
    assert config["extra"]["profile"] == "h200" and config["extra"]["uneven"] is True
    assert config["extra"]["model_error"] == "call"
    assert shipped.tier == "fitted" and shipped.device_name == "H200"
    assert shipped.kernel_table == "cbsim/kernel_tables/h200"


def test_every_value_says_where_it_came_from_and_kept_values_are_the_starts(shipped, start):
    values, base = leaves(shipped), leaves(start)
    self_described = {"name", "source", "provenance", "tier"}
    missing = [k for k in values if k not in self_described and k not in shipped.provenance]
    assert not missing
    for key, origin in shipped.provenance.items():
        assert origin.split(" ")[0] in ("fitted:", "measured:", "from", "kept"), key
        if origin.startswith(("from hardware=h200_estimates", "kept from hardware=h200_estimates")):
            assert values[key] == base[key], key
    # the measured GPU terms of the start are carried with their own provenance
    assert "measured" in shipped.provenance["gpu.attention_tile_share"]
    assert "measured" in shipped.provenance["gpu.clock.min_ratio"]
    assert shipped.provenance["gpu.decode_uneven_share"].startswith("measured: ")
    assert shipped.provenance["model_error.total_time"].startswith("measured: ")


def test_physical_rates_stay_as_measured(shipped, start):
    assert shipped.hbm_bandwidth == start.hbm_bandwidth == 4.27e12
    assert shipped.peak_flops == start.peak_flops
    for key in EFFICIENCIES:
        assert 0 < getattr(shipped.gpu, key) <= 1, key


def test_the_source_names_every_trace_of_the_fit_set(shipped, fit_set):
    assert len(fit_set) == 60
    for rec in fit_set:
        assert label(rec.path, rec.root) in shipped.source
    assert f"on {len(fit_set)} runtime trace(s)" in shipped.source


def test_the_copies_and_the_uneven_share_refit_to_the_shipped_values(shipped, start, fit_set):
    cal = Calibration(dataclasses.replace(start))
    fit_copies(fit_set, cal)
    for key in ("h2d_bandwidth", "d2h_bandwidth", "copy_latency_us"):
        assert getattr(shipped, key) == pytest.approx(getattr(cal.hardware, key), rel=1e-5), key
    share, runs = measure_uneven_share(fit_set, shipped)
    assert runs >= 1
    assert shipped.gpu.decode_uneven_share == pytest.approx(min(max(share, 0.0), 1.0), abs=6e-4)
