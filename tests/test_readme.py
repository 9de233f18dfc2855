"""The README's commands work as written: CI runs its test command, and every cbsim command of
"Using it" composes into a valid config (nothing is run here)."""

from __future__ import annotations

import re
import shlex

from conftest import REPO, make_config, run_cli
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

README = (REPO / "README.md").read_text()


def block_after(marker: str) -> str:
    opening = README.index("```bash\n", README.index(marker)) + len("```bash\n")
    return README[opening : README.index("```", opening)]


def test_ci_runs_exactly_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text()
    assert "<!-- test-command -->" in ci and "README.md" in ci
    command = block_after("<!-- test-command -->").strip()
    assert "\n" not in command, "one command: .ci/run runs the block as one line"
    assert "pytest -q" in command and "tests/test_sweep.py -k ray_local" in command


def using_it_commands() -> list[list[str]]:
    text = block_after("## Using it")
    out = []
    for line in text.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line.startswith("python -m cbsim ") and "--" not in line:
            out.append(shlex.split(line)[3:])
    return out


def test_every_using_it_command_composes():
    commands = using_it_commands()
    assert len(commands) >= 7
    for args in commands:
        if args[0] == "-m":
            overrides = OverridesParser.create().parse_overrides(args[1:])
            jobs = BasicSweeper.split_arguments(overrides, None)[0]
            todo = [list(jobs[0]), list(jobs[-1])]
        else:
            todo = [args]
        for job in todo:
            # hydra/... picks a launcher, not a config value
            make_config([o for o in job if not o.startswith("hydra")])


def test_version_is_cbsims(tmp_path):
    import cbsim

    r = run_cli(["--version"], cwd=tmp_path, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"cbsim {cbsim.__version__}"
