"""cbsim runs from a non-editable install, from any directory, without torch in sim mode."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO


@pytest.mark.slow
def test_non_editable_install_runs_from_anywhere(tmp_path):
    target = tmp_path / "site"
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
            str(REPO),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
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
