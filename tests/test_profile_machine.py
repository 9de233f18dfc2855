"""The one command that profiles a machine, run end to end on this CPU (mode.device=cpu
model=tiny: its smoke test), and the profile directory it writes selected by hardware=DIR."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from cbsim.config import ConfigError
from cbsim.profiling.options import read_options
from cbsim.profiling.select import auto_profile, rewrite

SMOKE = [
    "+experiment=profile_machine",
    "mode.device=cpu",
    "model=tiny",
    "extra.commit=abc123",
    "extra.cpu.only=[decode_b1,reference]",
]


def cbsim(args: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CBSIM_CONFIG_DIR": str(cwd / "user")}
    return subprocess.run(
        [sys.executable, "-m", "cbsim", *args, f"hydra.run.dir={cwd}/run_{time.monotonic_ns()}"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> Path:
    """One smoke profile for the whole test run, which its tests only read: made by the first
    test worker that asks, under a lock in the run's temporary directory (the parent of each
    xdist worker's own), and found there by the others."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    work = shared / "profile_machine_smoke"
    out = work / "prof"
    with open(shared / "profile_machine_smoke.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.is_dir():  # the command renames its output into place when it is whole
            work.mkdir(exist_ok=True)
            got = cbsim([*SMOKE, f"extra.out={out}"], work)
            assert got.returncode == 0, got.stderr[-2000:]
    return out


@pytest.mark.slow
def test_the_command_writes_one_profile_directory_with_yaml_tables_probes_and_manifest(profile):
    assert not profile.with_name("prof.partial").exists()
    (hw_yaml,) = (profile / "hardware").glob("*.yaml")
    hw = yaml.safe_load(hw_yaml.read_text())
    assert hw["name"] == hw_yaml.stem and hw["device_name"] == "cpu" and hw["tier"] == "profiled"
    assert hw["kernel_table"] == "kernels" and (profile / "kernels" / "tiny.csv").is_file()
    assert hw["provenance"]["hbm_bandwidth"].startswith("measured")
    assert any(v.startswith("fitted") for v in hw["provenance"].values())
    assert hw["provenance"]["gpu.carry_over_us"].startswith("from base h200_estimates")
    assert hw["hbm_bandwidth"] > 0 and 0 < hw["gpu"]["gemm_bandwidth_eff"] <= 1
    traces = sorted(p.relative_to(profile / "probes") for p in profile.glob("probes/*/*.gz"))
    assert Path("reference_1/trace_sync.json.gz") in traces and len(traces) >= 3


@pytest.mark.slow
def test_the_manifest_names_the_gpu_host_software_commit_command_and_step_times(profile):
    m = yaml.safe_load((profile / "manifest.yaml").read_text())
    assert m["gpu"]["name"] == "cpu" and m["gpu"]["torch"] and m["gpu"]["transformers"]
    assert m["host"]["cores"] >= 1 and m["host"]["ram_bytes"] > 0 and m["host"]["cpu"]
    assert m["commit"] and "+experiment=profile_machine" in m["command"]
    assert m["steps"]["device rates"]["status"] == "done"
    assert m["steps"]["probe reference_1 async"]["status"] == "skipped"
    assert m["steps"]["fit"]["seconds"] > 0 and "reference" in m["noise"]


@pytest.mark.slow
def test_fresh_processes_of_the_reference_set_the_host_level_and_its_spread(profile):
    """The reference probe run again as separate `python -m cbsim` processes (fresh/): each
    one's host factor in the manifest, their median on every host cost, their spread as
    host.spread.between_calls, and provenance saying so."""
    m = yaml.safe_load((profile / "manifest.yaml").read_text())
    runs = m["fresh"]["runs"]
    assert sorted(runs) == ["run_1", "run_2"] and all(r["host"] > 0 for r in runs.values())
    hosts = [r["host"] for r in runs.values()]
    assert m["fresh"]["host_factor"] == pytest.approx(sum(hosts) / 2, abs=1e-3)
    (hw_yaml,) = (profile / "hardware").glob("*.yaml")
    hw = yaml.safe_load(hw_yaml.read_text())
    assert hw["host"]["spread"]["between_calls"] == pytest.approx(m["fresh"]["between_calls"])
    assert hw["provenance"]["host.spread.between_calls"].startswith("measured: std of log")
    assert "fresh runs" in hw["provenance"]["host.schedule.fixed_us"]
    assert hw["gpu"]["spread"]["forward_scale"] == pytest.approx(m["fresh"]["forward_factor"], 1e-3)
    assert "forward factor" in hw["provenance"]["gpu.spread.forward_scale"]
    assert len(list(profile.glob("fresh/run_*/trace*.json.gz"))) == 2


def test_separate_processes_up_to_several_times_slower_are_still_the_machine(tmp_path):
    """The H200's recorded reference runs (separate processes, three sessions) as fresh runs of
    h200_profiled: all six are kept, though they run x1.7-x3.6 its in-process probes' host."""
    from conftest import make_config

    from cbsim.profiling.fresh import FRESH_DIR, fresh_level

    recordings = REPO / "experiments" / "recordings" / "h200"
    for i, session in enumerate(("fit_a", "fit_a", "fit_b", "fit_b", "fit_padded", "fit_padded")):
        case = ("ref", "rep")[i % 2] + "_8b_16x512+256"
        shutil.copytree(recordings / session / case, tmp_path / FRESH_DIR / f"run_{i + 1}")
    level = fresh_level(tmp_path, make_config(["hardware=h200_profiled"]).hardware)
    hosts = sorted(m.host for m in level.machines.values())
    assert len(hosts) == 6 and hosts[0] > 1.5 and hosts[-1] > 3
    assert level.host == pytest.approx((hosts[2] + hosts[3]) / 2)
    assert 0.1 < level.between_calls < 0.4


def test_kernel_tables_made_before_are_given_named_and_kept_by_a_refit(tmp_path):
    """extra.kernel_tables: tables of this GPU from +experiment=profile_kernels in place of
    measuring them; the manifest keeps the path so a refit uses them again; a path without
    tables is refused in one line before anything is fitted."""
    copy = tmp_path / "p"
    shutil.copytree(REPO / "cbsim" / "profiles" / "h100_80gb_hbm3", copy)
    shutil.rmtree(copy / "kernels")
    got = cbsim(
        [
            "+experiment=profile_machine",
            f"extra.refit={copy}",
            "extra.kernel_tables=cbsim/kernel_tables/h100",
        ],
        tmp_path,
        timeout=400,
    )
    assert got.returncode == 0, got.stderr[-2000:]
    m = yaml.safe_load((copy / "manifest.yaml").read_text())
    assert m["kernel_tables"] == "cbsim/kernel_tables/h100"
    hw = yaml.safe_load((copy / "hardware" / "h100_80gb_hbm3.yaml").read_text())
    assert hw["kernel_table"] == m["kernel_tables"]
    assert hw["provenance"]["kernel_table"].startswith("given: extra.kernel_tables=")
    assert "kernel tables given" in hw["source"] and "kernel tables measured" not in hw["source"]
    got = cbsim(
        ["+experiment=profile_machine", f"extra.refit={copy}", f"extra.kernel_tables={tmp_path}"],
        tmp_path,
    )
    assert got.returncode == 2 and "hardware.kernel_table=" in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1


def test_a_fresh_run_is_the_users_command_with_the_probes_values():
    from cbsim.profiling.fresh import fresh_command
    from cbsim.profiling.options import Probe

    args = [
        "+experiment=profile_machine",
        "mode=runtime",
        "mode.attention=torch",
        "model=llama3_8b",
        "extra.models=[llama3_1b]",
        "hydra.run.dir=x",
    ]
    probe = Probe("reference", {"workload.batch_size": 32, "engine.cuda_graphs": False})
    cmd = fresh_command(args, "llama3_1b", probe, Path("/p/fresh/run_1"))
    assert cmd[1:4] == ["-m", "cbsim", "mode=runtime"]
    assert (
        "mode.attention=torch" in cmd and "model=llama3_1b" in cmd and "model=llama3_8b" not in cmd
    )
    assert "workload.batch_size=32" in cmd and "engine.cuda_graphs=false" in cmd
    assert "engine=compare" in cmd and "hydra.run.dir='/p/fresh/run_1'" in cmd
    assert not any(a.startswith(("extra.", "+experiment", "hydra.run.dir=x")) for a in cmd)
    assert not any(
        a.startswith("model.")
        for a in fresh_command([*args, "model.num_layers=2"], "llama3_1b", probe, Path("/p"))
    )
    cpu = fresh_command([*args, "mode.device=cpu"], None, probe, Path("/q"))
    assert "engine=sync" in cpu and "model=llama3_8b" in cpu


@pytest.mark.slow
def test_hardware_dir_composes_and_simulates_with_its_own_kernel_table(profile, tmp_path):
    got = cbsim(
        [
            f"hardware={profile}",
            "model=tiny",
            "workload.batch_size=2",
            "workload.prompt_len=16",
            "workload.gen_len=8",
            "output.report=false",
            "mode.bands=false",
        ],
        tmp_path,
    )
    assert got.returncode == 0, got.stderr[-2000:]
    assert "cbsim: metrics:" in got.stdout


@pytest.mark.slow
def test_refit_rewrites_the_same_yaml_from_the_probes(profile, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(profile, copy)
    (before,) = (copy / "hardware").glob("*.yaml")
    text = before.read_text()
    before.unlink()
    got = cbsim(["+experiment=profile_machine", f"extra.refit={copy}"], tmp_path)
    assert got.returncode == 0, got.stderr[-2000:]
    assert before.read_text() == text


def numbers(node, path=""):
    """Every leaf of a YAML tree by its dotted key."""
    if isinstance(node, dict):
        return {k: v for key, val in node.items() for k, v in numbers(val, f"{path}{key}.").items()}
    return {path.rstrip("."): node}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["h200_profiled", "h100_80gb_hbm3"])
def test_a_shipped_profile_is_what_refit_makes_of_its_own_probes(name, tmp_path):
    """What ships is reproducible: the committed probes, re-fitted by the package's command, give
    the committed values (to the last digits that a different CPU's floating point can move)."""
    shipped = REPO / "cbsim" / "profiles" / name
    copy = tmp_path / name
    shutil.copytree(shipped, copy)
    (yaml_path,) = (copy / "hardware").glob("*.yaml")
    yaml_path.unlink()
    got = cbsim(["+experiment=profile_machine", f"extra.refit={copy}"], tmp_path, timeout=400)
    assert got.returncode == 0, got.stderr[-2000:]
    want = numbers(yaml.safe_load((shipped / "hardware" / yaml_path.name).read_text()))
    have = numbers(yaml.safe_load(yaml_path.read_text()))
    assert have.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, float):
            assert have[key] == pytest.approx(value, rel=1e-6, abs=1e-12), key
        else:
            assert have[key] == value, key


@pytest.mark.slow
def test_an_interrupted_run_leaves_no_profile_directory(tmp_path):
    out = tmp_path / "prof"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [
        sys.executable,
        "-m",
        "cbsim",
        *SMOKE,
        f"extra.out={out}",
        f"hydra.run.dir={tmp_path}/r",
    ]
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not out.with_name("prof.partial").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert not out.exists() and not out.with_name("prof.partial").exists()


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"out": "d", "models": ["tiny"], "max_minutes": -1, "probes": []}, "extra.max_minutes"),
        ({"out": "d", "models": [], "probes": []}, "extra.models"),
        ({"models": ["tiny"], "probes": [{"name": "a"}]}, "extra.out"),
        ({"out": "d", "probes": [{"name": "a", "repeat": 0}]}, "extra.probes[0].repeat"),
        ({"out": "d", "probes": [{"name": "a"}], "bogus": 1}, "extra.bogus"),
        ({"out": "d", "probes": [{"name": "a"}], "cpu": {"cap": 1}}, "extra.cpu.cap"),
        ({"out": "d", "probes": [{"name": "a"}], "model_probes": ["b"]}, "extra.model_probes"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_key(extra, key):
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        read_options(extra)


def test_every_model_after_the_first_runs_the_model_probes_under_its_own_names():
    extra = {"out": "d", "model_probes": ["b"], "cpu": {"only": ["a"]}, "fresh_runs": 0}
    opts = read_options({**extra, "probes": [{"name": "a"}, {"name": "b", "repeat": 2}]})
    assert [(p.name, p.repeat) for p in opts.probes_of("llama3_1b")] == [("b_llama3_1b", 2)]
    assert opts.on_cpu().probes_of("llama3_1b") == []


@pytest.mark.slow
def test_the_command_line_refuses_a_bad_setting_before_any_directory_exists(tmp_path):
    got = cbsim([*SMOKE, f"extra.out={tmp_path / 'prof'}", "extra.max_minutes=0"], tmp_path, 120)
    assert got.returncode == 2 and "extra.max_minutes" in got.stderr
    assert not any(tmp_path.glob("prof*"))


def _profile(root: Path, name: str, device: str, tier: str) -> None:
    (root / name / "hardware").mkdir(parents=True)
    text = yaml.safe_dump({"name": name, "device_name": device, "tier": tier})
    (root / name / "hardware" / f"{name}.yaml").write_text(text)


def test_auto_picks_the_best_tier_of_the_gpu_found_and_the_users_own_first(tmp_path, monkeypatch):
    monkeypatch.setenv("CBSIM_CONFIG_DIR", str(tmp_path))
    _profile(tmp_path / "profiles", "mine_fitted", "NVIDIA X", "fitted")
    _profile(tmp_path / "profiles", "mine_profiled", "NVIDIA X", "profiled")
    _profile(tmp_path / "profiles", "other", "NVIDIA Y", "profiled")
    assert auto_profile("NVIDIA X").name == "mine_profiled"
    with pytest.raises(ConfigError, match="no profile of 'NVIDIA Z'"):
        auto_profile("NVIDIA Z")


def test_a_profile_name_becomes_a_search_path_entry_and_an_absolute_kernel_table(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("CBSIM_CONFIG_DIR", str(tmp_path))
    _profile(tmp_path / "profiles", "h9", "NVIDIA X", "profiled")
    (tmp_path / "profiles" / "h9" / "kernels").mkdir()
    yml = tmp_path / "profiles" / "h9" / "hardware" / "h9.yaml"
    yml.write_text(yml.read_text() + "kernel_table: kernels\n")
    args = rewrite(["model=tiny", "hardware=h9"])
    root = tmp_path / "profiles" / "h9"
    assert args[:3] == ["model=tiny", "hardware=h9", f"hardware.kernel_table='{root}/kernels'"]
    assert args[3].startswith(f"hydra.searchpath=['file://{root}'")
    assert rewrite(["hardware=h200"]) == ["hardware=h200"]


def test_a_profile_directory_named_as_a_shipped_one_is_the_one_selected(tmp_path):
    """The one command names an H100's profile as the shipped H100 profile is named: selected by
    its path, the user's measurement is used, not the shipped one; by name, the shipped one."""
    from cbsim.api import compose

    copy = tmp_path / "h100_80gb_hbm3"
    shutil.copytree(REPO / "cbsim" / "profiles" / "h100_80gb_hbm3", copy)
    (yml,) = (copy / "hardware").glob("*.yaml")
    data = yaml.safe_load(yml.read_text())
    data["host"]["schedule"]["fixed_us"] = 123.0
    yml.write_text(yaml.safe_dump(data, sort_keys=False))
    assert compose(f"hardware={copy}").hardware.host.schedule.fixed_us == 123.0
    assert compose("hardware=h100_80gb_hbm3").hardware.host.schedule.fixed_us != 123.0
