"""A calibrated profile goes to the run directory, and only when asked into the user config
directory that Hydra searches, where hardware=<profile> then finds it from any directory."""

from __future__ import annotations

from conftest import REPO, run_cli
from test_validation import RUNS, make_recording


def test_install_writes_the_user_config_directory_and_hardware_selects_it(tmp_path, monkeypatch):
    user = tmp_path / "user_conf"
    monkeypatch.setenv("CBSIM_CONFIG_DIR", str(user))
    rec = [make_recording(tmp_path, b, e) for b, e, *_ in RUNS[:2]]
    out = tmp_path / "cal"
    res = run_cli(
        [
            "+experiment=calibrate",
            f"trace=[{rec[0]},{rec[1]}]",
            "extra.profile=h200_user",
            "extra.install=true",
            f"hydra.run.dir={out}",
        ],
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    installed = user / "hardware" / "h200_user.yaml"
    assert installed.is_file() and (out / "h200_user.yaml").read_text() == installed.read_text()
    assert not (REPO / "conf" / "hardware" / "h200_user.yaml").exists()
    # from another directory, the installed profile is a hardware choice like a shipped one
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    res = run_cli(["hardware=h200_user", "--cfg", "job"], cwd=elsewhere)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "name: h200_user" in res.stdout
    # a shipped preset's name would be shadowed: refused in one line
    res = run_cli(
        [
            "+experiment=calibrate",
            f"trace=[{rec[0]}]",
            "extra.profile=h200",
            "extra.install=true",
            f"hydra.run.dir={tmp_path / 'cal2'}",
        ],
        cwd=tmp_path,
    )
    assert res.returncode == 2 and "extra.profile=h200: a shipped preset" in res.stderr
    assert "Traceback" not in res.stderr
