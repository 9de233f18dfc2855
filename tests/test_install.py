"""cbsim runs from a non-editable install, from any directory, without torch in sim mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO


def tracked_copy(root: Path) -> Path:
    """The checkout's tracked files copied to ``root``: a build of its own (pip writes build/
    into the source tree, and two test workers may build at once)."""
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src, dst = REPO / name.decode(), root / name.decode()
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(src.read_bytes())
    return root


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """cbsim installed (not editable) into a directory of its own, once for this module."""
    work = tmp_path_factory.mktemp("install")
    source = tracked_copy(work / "source")
    target = work / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return target


@pytest.mark.slow
def test_non_editable_install_runs_from_anywhere(installed, tmp_path):
    target = installed
    assert (target / "cbsim" / "conf" / "config.yaml").is_file()
    assert (target / "cbsim" / "runtime" / "__init__.py").is_file()
    env = {**os.environ, "PYTHONPATH": str(target)}
    work = tmp_path / "elsewhere"
    work.mkdir()
    probe = subprocess.run(
        [sys.executable, "-c", "import cbsim.conf; print(cbsim.conf.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.startswith(str(target))
    result = subprocess.run(
        [sys.executable, "-m", "cbsim", "--cfg", "job", "+experiment=long_seq"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "gen_len" in result.stdout


@pytest.mark.slow
def test_validate_runs_from_a_plain_install_on_the_shipped_recordings(installed, tmp_path):
    shipped = installed / "cbsim" / "recorded" / "h200" / "six_workloads"
    assert (shipped / "manifest.yaml").is_file()
    assert len(list(shipped.glob("*/trace_*.json.gz"))) == 12
    work = tmp_path / "empty"
    work.mkdir()
    # one workload of the default set (the whole default takes 40 s): each engine from the other
    args = ["+experiment=validate", "trace=[h200/six_workloads/small_batch/trace_*.json.gz]"]
    args += ["extra.jobs=1", "extra.progress=false", "hydra.run.dir=out"]
    result = subprocess.run(
        [sys.executable, "-m", "cbsim", *args],
        cwd=work,
        env={**os.environ, "PYTHONPATH": str(installed)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert f"recordings: {shipped.parents[1]} (the compact set shipped with cbsim" in result.stdout
    out = json.loads((work / "out" / "validation.json").read_text())
    assert out["recordings"] == str(shipped.parents[1])
    assert [r["name"] for r in out["runs"]] == [
        "h200/six_workloads/small_batch/trace_async",
        "h200/six_workloads/small_batch/trace_sync",
    ]
    assert (work / "out" / "validation.html").is_file()


def test_sim_mode_never_imports_torch():
    code = (
        "import sys, cbsim, cbsim.app, cbsim.sim, cbsim.metrics, cbsim.report;"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_every_package_folder_is_listed_and_no_links():
    """The package-dir mapping lists packages by hand: a new folder must be added to it."""
    import tomllib
    from conftest import REPO

    listed = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    roots = {
        "cbsim": REPO / "cbsim",
        "cbsim.runtime": REPO / "runtime",
        "cbsim.conf": REPO / "conf",
        "hydra_plugins": REPO / "hydra_plugins",
    }
    found = set()
    for name, root in roots.items():
        for init in root.rglob("__init__.py"):
            rel = init.parent.relative_to(root).parts
            found.add(".".join((name, *rel)))
    assert not (REPO / "hydra_plugins" / "__init__.py").exists(), "Hydra's namespace: no __init__"
    assert found - listed == set(), "package folders missing from pyproject's packages"
    links = [
        p
        for p in REPO.rglob("*")
        if p.is_symlink() and not any(part.startswith(".venv") for part in p.parts)
    ]
    assert links == []


@pytest.mark.slow
def test_the_readme_first_command_passes_from_the_checkout_root(tmp_path):
    """The README's install-and-run line exactly as written, in a fresh copy of the checkout (its
    tracked files), from its root: the checkout's ./cbsim must not shadow the installed
    cbsim.conf."""
    from test_readme import block_after

    command = block_after("## Install and run").strip()
    assert command.startswith("python3 -m venv .venv") and "pip install ." in command
    root = tracked_copy(tmp_path / "checkout")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(
        ["bash", "-c", command + " hydra.run.dir=out"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-2000:])
    assert "async speedup" in result.stdout
    assert (root / "out" / "report.html").is_file()
