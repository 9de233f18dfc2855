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


def section(heading: str) -> str:
    start = README.index(heading)
    end = README.find("\n## ", start + len(heading))
    return README[start : end if end > 0 else len(README)]


def three_questions_commands() -> list[list[str]]:
    """Every `python -m cbsim` line of the README's "Three questions" blocks, but those that
    select the profile directory the profiling command makes."""
    out = []
    for block in section("## Three questions").split("```bash\n")[1:]:
        for line in block.split("```")[0].splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line.startswith("python -m cbsim ") and "hardware=my_gpu" not in line:
                out.append(shlex.split(line)[3:])
    return out


def test_every_three_questions_command_composes():
    commands = three_questions_commands()
    assert len(commands) >= 4
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


def test_the_readme_is_short_and_its_paragraphs_too():
    lines = README.splitlines()
    assert len(lines) <= 150
    paragraph = 0
    for line in lines:
        paragraph = paragraph + 1 if line.strip() and not line.startswith("|") else 0
        assert paragraph <= 10, line


def test_version_is_cbsims(tmp_path):
    import cbsim

    r = run_cli(["--version"], cwd=tmp_path, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"cbsim {cbsim.__version__}"
