"""Fresh runs recorded on other machines of the profile's GPU (extra.fresh_from): each machine's
runs join the profile under fresh/gpu-<uuid>/, and the host level and its spread are taken over
them all (cbsim/profiling/fresh.py)."""

from __future__ import annotations

import shutil

import pytest
from conftest import REPO, make_config

from cbsim.config import ConfigError
from cbsim.profiling.fresh import FRESH_DIR, add_fresh, fresh_level
from cbsim.profiling.options import read_options

H100 = "NVIDIA H100 80GB HBM3"
HELDOUT = REPO / "experiments" / "recordings" / "h100" / "heldout"


def machine_folder(tmp_path, name: str, runs: list[str]):
    """A folder of run folders, as the fresh command leaves them on a machine."""
    folder = tmp_path / name
    for i, run in enumerate(runs, 1):
        shutil.copytree(HELDOUT / run, folder / f"run_{i}")
    return folder


def test_another_machines_runs_join_the_level_and_widen_its_spread(tmp_path):
    profile = tmp_path / "profile"
    shutil.copytree(REPO / "cbsim" / "profiles" / "h100_80gb_hbm3" / FRESH_DIR, profile / FRESH_DIR)
    hw = make_config(["hardware=h100_80gb_hbm3"]).hardware
    own = fresh_level(profile, hw)
    # r4 and r5 were recorded on one machine (their manifest), r2 on another
    slow = machine_folder(tmp_path, "m3", ["r4/8b_32x256+1024", "r5/8b_32x256+1024"])
    assert add_fresh(profile, [str(slow)], H100) == [f"{FRESH_DIR}/gpu-73c43fc7"]
    both = fresh_level(profile, hw)
    assert set(own.machines) < set(both.machines)
    assert {"gpu-73c43fc7/run_1", "gpu-73c43fc7/run_2"} <= set(both.machines)
    assert both.between_calls > own.between_calls
    added = [both.machines[k].host for k in both.machines if k.startswith("gpu-")]
    assert min(added) > max(m.host for m in own.machines.values())  # that machine's slow host
    assert not list(profile.glob(f"{FRESH_DIR}/*.partial"))


@pytest.mark.parametrize(
    "runs, words",
    [
        ([], "holds no run folder"),
        (["r2/8b_1x128+512", "r4/8b_1x128+512"], "runs of 2 machines"),
        (["r4/8b_1x128+512"], "already holds this machine"),
    ],
)
def test_a_source_that_is_not_one_new_machine_of_this_gpu_is_refused(tmp_path, runs, words):
    profile = tmp_path / "profile"
    (profile / FRESH_DIR / "gpu-73c43fc7").mkdir(parents=True)
    folder = machine_folder(tmp_path, "m", runs)
    folder.mkdir(exist_ok=True)
    with pytest.raises(ConfigError, match=words):
        add_fresh(profile, [str(folder)], H100)
    assert sorted(p.name for p in (profile / FRESH_DIR).iterdir()) == ["gpu-73c43fc7"]


def test_runs_of_another_gpu_and_fresh_from_without_a_profile_are_refused(tmp_path):
    h200 = REPO / "experiments" / "recordings" / "h200" / "fit_a" / "ref_8b_16x512+256"
    shutil.copytree(h200, tmp_path / "m" / "run_1")
    with pytest.raises(ConfigError, match="ran on NVIDIA H200.*allowed: runs of NVIDIA H100"):
        add_fresh(tmp_path / "profile", [str(tmp_path / "m")], H100)
    with pytest.raises(ConfigError, match="extra.fresh_from.*extra.refit"):
        read_options({"out": "d", "probes": [{"name": "reference"}], "fresh_from": ["m"]})


def test_eager_runs_join_as_eager_runs_and_set_only_the_eager_launch_level(tmp_path):
    """A machine's runs without CUDA graphs join as fresh/gpu-<uuid>/eager_<i>: they give an
    eager launch factor and no host factor, and the level puts every eager launch cost at the
    median eager factor, every other host cost at the host factor."""
    from cbsim.profiling.fresh import EAGER_LAUNCH_COSTS, apply_level

    profile = tmp_path / "profile"
    shutil.copytree(REPO / "cbsim" / "profiles" / "h100_80gb_hbm3" / FRESH_DIR, profile / FRESH_DIR)
    hw = make_config(["hardware=h100_80gb_hbm3"]).hardware
    machine = REPO / "experiments" / "heldout" / "h100" / "fresh_gpu-d680c9a1"
    only_eager = tmp_path / "m6"
    for run in ("eager_1", "eager_2"):
        shutil.copytree(machine / run, only_eager / f"x_{run}")
    (added,) = add_fresh(profile, [str(only_eager)], H100)
    assert sorted(p.name for p in (profile / added).iterdir()) == ["eager_1", "eager_2"]
    level = fresh_level(profile, hw)
    eager_runs = {k for k in level.eager_runs if k.startswith("gpu-")}
    assert eager_runs == {f"{added.split('/')[1]}/eager_1", f"{added.split('/')[1]}/eager_2"}
    assert not any(k.startswith("gpu-") for k in level.machines)  # no host factor from them
    assert len(level.eager_runs) == 5 and level.eager == pytest.approx(
        sorted(level.eager_runs.values())[2]
    )
    prov = {f"host.{k}": "fitted" for k in ("kernel_launch_us", "eager_forward_us", "event_us")}
    scaled = apply_level(hw, level, prov)
    for key in EAGER_LAUNCH_COSTS:
        want = level.eager * getattr(hw.host, key)
        assert getattr(scaled.host, key) == pytest.approx(want)
        assert "eager launch factor" in prov[f"host.{key}"]
    assert scaled.host.event_us == pytest.approx(level.host * hw.host.event_us)
    assert "median host factor" in prov["host.event_us"]


def test_the_fresh_eager_probe_is_the_first_probe_without_graphs_unless_named():
    probes = [{"name": "reference"}, {"name": "e", "set": {"engine.cuda_graphs": False}}]
    assert read_options({"out": "d", "probes": probes}).fresh_eager_probe == "e"
    assert read_options({"out": "d", "probes": probes[:1]}).fresh_eager_probe is None
    with pytest.raises(ConfigError, match="fresh_eager_probe='x' is not a probe; allowed: ref"):
        read_options({"out": "d", "probes": probes, "fresh_eager_probe": "x"})
    with pytest.raises(ConfigError, match="fresh_eager_runs=11; allowed: an integer 0 to 10"):
        read_options({"out": "d", "probes": probes, "fresh_eager_runs": 11})
