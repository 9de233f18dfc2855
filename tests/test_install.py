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
