"""task=record_set: a named set of workloads recorded N times through python -m cbsim, one
folder per repeat, resumable across commands; and the H100 held-out set it records.

The smoke test runs the real runtime on the CPU (model=tiny, the sync engine: the async engine
needs CUDA), each case in a process of its own as on a GPU.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import REPO, compose_cfg, make_config
from omegaconf import OmegaConf

from cbsim.config import ConfigError
from cbsim.validation.record_set import RecordSet, forwarded, run_record_set

pytest.importorskip("torch")

CPU = ["mode.device=cpu", "model=tiny", "engine=sync"]
TINY = {"a": ["workload.batch_size=2", "workload.prompt_len=8", "workload.gen_len=4"]}


def record(out: Path, run_dir: Path, repeats: int, max_seconds: float, **extra) -> dict:
    cfg = make_config(
        [
            "+experiment=record_set",
            f"extra.out={out}",
            f"extra.repeats={repeats}",
            f"extra.max_seconds={max_seconds}",
            "extra.set=smoke",
        ]
    )
    cfg.extra.update(cases=TINY, **{"pass": CPU}, **extra)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_record_set(cfg, run_dir)


def test_a_set_is_recorded_per_repeat_and_resumed_by_the_next_command(tmp_path):
    out = tmp_path / "set"
    # past its time budget after the first case (a process that imports torch takes longer than
    # a second anywhere): the second repeat is left for the next command
    first = record(out, tmp_path / "run1", repeats=2, max_seconds=1)
    assert first["recorded"] == ["r1/a"] and first["left"] == ["r2/a"] and not first["failed"]
    second = record(out, tmp_path / "run2", repeats=1, max_seconds=600, commit="abc1234")
    assert second["recorded"] == ["r2/a"], second
    for r in ("r1", "r2"):
        case = out / r / "a"
        assert (case / "trace.json.gz").is_file() and (case / "metrics.json").is_file()
        manifest = yaml.safe_load((case / "manifest.yaml").read_text())
        assert manifest["session"] == "smoke" and "model=tiny" in manifest["command"]
    calls = {
        yaml.safe_load((out / r / "a" / "manifest.yaml").read_text())["call"] for r in ("r1", "r2")
    }
    assert len(calls) == 2  # two commands: two device calls
    # a copied tree's git may be stale: the command line's commit wins
    assert yaml.safe_load((out / "r2" / "a" / "manifest.yaml").read_text())["commit"] == "abc1234"
    assert json.loads((tmp_path / "run2" / "record_set.json").read_text())["recorded"] == ["r2/a"]
    metrics = json.loads((out / "r2" / "a" / "metrics.json").read_text())
    assert metrics["engine"] == "sync" and metrics["generated_tokens"] == 2 * 4


def test_a_committed_repeat_is_not_recorded_over(tmp_path):
    """The repository keeps a case's manifest and traces only; a command given those repeats
    numbers its own after them."""
    out = tmp_path / "set"
    record(out, tmp_path / "run1", repeats=1, max_seconds=600)
    case = out / "r1" / "a"
    kept = {p.name for p in case.iterdir()}
    for p in case.iterdir():
        if p.name != "manifest.yaml" and not p.name.startswith("trace"):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    second = record(out, tmp_path / "run2", repeats=1, max_seconds=600)
    assert second["recorded"] == ["r2/a"], second
    assert "metrics.json" in kept and not (case / "metrics.json").exists()


def test_wrong_settings_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="extra.cases names no case"):
        RecordSet.from_extra({"out": str(tmp_path)})
    with pytest.raises(ConfigError, match="extra.out is not set"):
        RecordSet.from_extra({"cases": TINY})
    with pytest.raises(ConfigError, match="extra.repeat=3 is not a setting of task=record_set"):
        RecordSet.from_extra({"cases": TINY, "out": "x", "repeat": 3})
    with pytest.raises(ConfigError, match="extra.cases.a="):
        RecordSet.from_extra({"cases": {"a": "model=tiny"}, "out": "x"})


def test_the_command_lines_run_overrides_reach_every_case_but_its_own_do_not():
    cli = ["+experiment=heldout", "extra.repeats=2", "model=tiny", "hydra.run.dir=x"]
    assert forwarded([*cli, "mode.device=cpu", "trace=[a]"]) == ["model=tiny", "mode.device=cpu"]


def test_the_h100_held_out_set_spans_the_regimes_in_valid_configs():
    cfg = compose_cfg(["+experiment=heldout", "extra.out=x"])
    s = RecordSet.from_extra(OmegaConf.to_container(cfg.extra, resolve=True))
    assert s.name == "heldout" and 6 <= len(s.cases) <= 8
    models = set()
    for name, over in s.cases.items():
        c = make_config([*s.base, *over])  # each case is a valid runtime config
        assert c.mode.name == "runtime" and c.engine.name == "compare", name
        models.add(c.model.name)
    joined = [" ".join(o) for o in s.cases.values()]
    assert any("engine.cuda_graphs=false" in j for j in joined)
    assert any("workload.arrival=poisson" in j for j in joined)
    assert any("workload.batch_size=1 " in j + " " for j in joined)
    profiled = {p.stem for p in (REPO / "cbsim" / "kernel_tables").glob("*/*.csv")}
    assert len(models - profiled) >= 2  # shapes no kernel table was measured on
