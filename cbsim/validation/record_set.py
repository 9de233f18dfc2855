"""``task=record_set``: record a named set of workloads N times, each through ``python -m cbsim
mode=runtime engine=compare`` as a user runs it, into ``<out>/r<k>/<case>/trace_{sync,async}``.

A workload's truth is the mean of its repeats (cbsim.validation.judge), so the set is recorded
several times, on more than one machine: a second command with the same ``extra.out`` numbers
its repeats on from the last, and a case already recorded is never run again (a command cut
short by its time budget is resumed by the next). Each case folder gets a manifest.yaml naming
the command's device call, the GPU and the software, which the validation reads.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from cbsim.config import CbsimConfig, ConfigError
from cbsim.host import cpu_model
from cbsim.rundir import atomic_write_text

EXTRA_KEYS = {
    "set": "the set's name (the recordings' session)",
    "cases": "case name -> Hydra overrides of that workload (a list), run in this order",
    "repeats": "repeats this command records, numbered on after those already in extra.out",
    "out": "the set's folder (absolute, or relative to the working directory)",
    "base": "overrides put before every case's (mode=runtime engine=compare ...)",
    "pass": "overrides put after every case's (the command line's own come after these)",
    "max_seconds": "no case is started past this many seconds; the next command resumes",
    "case_timeout_s": "a case's run is stopped after this many seconds",
    "commit": "the cbsim commit for the manifests, where git cannot tell it (a copied tree)",
}
# the command line's overrides not passed on to the cases: this command's own
OWN = ("+experiment", "experiment", "extra.", "+extra.", "++extra.", "hydra.", "task", "trace")


@dataclass(frozen=True)
class RecordSet:
    """What one command records, from ``extra``."""

    name: str
    cases: dict[str, list[str]]
    repeats: int
    out: Path
    base: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)
    max_seconds: float = 540.0
    case_timeout_s: float = 300.0
    commit: str = ""  # empty: git's HEAD of the checkout cbsim runs from

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> RecordSet:
        for key in extra:
            if key not in EXTRA_KEYS:
                raise ConfigError(
                    f"extra.{key}={extra[key]} is not a setting of task=record_set; allowed: "
                    + ", ".join(sorted(EXTRA_KEYS))
                )
        cases = extra.get("cases") or {}
        if not hasattr(cases, "items") or not cases:
            raise ConfigError("extra.cases names no case; allowed: {name: [override, ...]}")
        for name, over in cases.items():
            if not isinstance(over, (list, tuple)) or not all(isinstance(o, str) for o in over):
                raise ConfigError(f"extra.cases.{name}={over!r}; allowed: a list of overrides")
            if not str(name).replace("+", "").replace("_", "").replace("-", "").isalnum():
                raise ConfigError(f"extra.cases.{name}: allowed names: letters, digits, _ - +")
        if not extra.get("out"):
            raise ConfigError("extra.out is not set; allowed: the set's folder (DIR)")
        repeats = extra.get("repeats", 3)
        if not isinstance(repeats, int) or not 1 <= repeats <= 100:
            raise ConfigError(f"extra.repeats={repeats!r}; allowed: an integer 1 to 100")
        return cls(
            name=str(extra.get("set") or "set"),
            cases={str(k): [str(o) for o in v] for k, v in cases.items()},
            repeats=repeats,
            out=Path(os.path.expanduser(str(extra["out"]))).absolute(),
            base=[str(o) for o in extra.get("base") or []],
            passed=[str(o) for o in extra.get("pass") or []],
            max_seconds=float(extra.get("max_seconds", 540.0)),
            case_timeout_s=float(extra.get("case_timeout_s", 300.0)),
            commit=str(extra.get("commit") or ""),
        )


def done(folder: Path) -> bool:
    """A case recorded: its trace(s), and its run finished (metrics.json) or was recorded by this
    command (manifest.yaml, written after the run; a committed repeat keeps only it and the traces,
    and must not be recorded over)."""
    finished = (folder / "metrics.json").is_file() or (folder / "manifest.yaml").is_file()
    return finished and any(folder.glob("trace*.json.gz"))


def repeat_folders(s: RecordSet) -> list[Path]:
    """The folders this command fills: an unfinished last repeat first, then new ones."""
    have = sorted(
        (p for p in s.out.glob("r*") if p.is_dir() and p.name[1:].isdigit()),
        key=lambda p: int(p.name[1:]),
    )
    start = int(have[-1].name[1:]) if have else 0
    folders = []
    if have and not all(done(have[-1] / c) for c in s.cases):
        folders.append(have[-1])
    while len(folders) < s.repeats:
        start += 1
        folders.append(s.out / f"r{start}")
    return folders


def forwarded(overrides: list[str]) -> list[str]:
    """The command line's overrides that describe the runs (model, mode.device, ...), not this
    command's own (its preset, extra.*, hydra.*)."""
    return [o for o in overrides if not o.lstrip("~").startswith(OWN)]


def command_line_overrides() -> list[str]:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    return list(HydraConfig.get().overrides.task)


def case_command(s: RecordSet, case: str, folder: Path, cli: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "cbsim",
        *s.base,
        *s.cases[case],
        *s.passed,
        *forwarded(cli),
        f"hydra.run.dir={folder}",
    ]


def machine() -> dict[str, str]:
    """The GPU (nvidia-smi, where there is one), the host and the software, as one-liners."""
    gpu = "no NVIDIA GPU found (nvidia-smi)"
    if shutil.which("nvidia-smi"):
        got = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        )
        gpu = "; ".join(got.stdout.strip().splitlines()) or gpu
    soft = []
    for pkg in ("torch", "transformers", "triton", "cbsim"):
        try:
            soft.append(f"{pkg} {importlib.metadata.version(pkg)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return {
        "hardware": f"{gpu}; host {cpu_model()}, {os.cpu_count()} cores",
        "software": ", ".join([*soft, f"Python {platform.python_version()}"]),
    }


def commit() -> str:
    here = Path(__file__).resolve().parents[2]
    got = subprocess.run(
        ["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return got.stdout.strip() if got.returncode == 0 else ""


def write_manifest(folder: Path, s: RecordSet, call: str, cmd: list[str], info: dict) -> None:
    """The case's manifest.yaml (cbsim.calibration.manifest): this command's device call."""
    body = {
        "session": s.name,
        "stack": s.name,
        "call": call,
        "recorded": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": s.commit or commit(),
        "command": "python " + " ".join(cmd[1:]),
        **info,
    }
    atomic_write_text(folder / "manifest.yaml", yaml.safe_dump(body, sort_keys=False))


def run_case(s: RecordSet, case: str, folder: Path, cli: list[str]) -> tuple[bool, str]:
    """One case, both engines, in a process of its own; (recorded, its last line)."""
    target = folder / case
    target.mkdir(parents=True, exist_ok=True)
    cmd = case_command(s, case, target, cli)
    try:
        got = subprocess.run(cmd, capture_output=True, text=True, timeout=s.case_timeout_s)
    except subprocess.TimeoutExpired:
        return False, f"stopped after {s.case_timeout_s:g} s (extra.case_timeout_s)"
    (target / "trace_compare.json.gz").unlink(missing_ok=True)  # both traces, merged again
    lines = [ln for ln in (got.stdout + got.stderr).splitlines() if ln.strip()]
    if got.returncode != 0 or not (target / "metrics.json").is_file():
        return False, lines[-1] if lines else f"exit status {got.returncode}"
    said = [ln for ln in lines if ln.startswith("async speedup")]
    return True, said[-1] if said else "recorded"


def run_record_set(config: CbsimConfig, run_dir: Path) -> dict[str, Any]:
    """Record every case of the set ``extra.repeats`` times; what was recorded, what failed and
    what was left for the next command go to record_set.json."""
    import json

    s = RecordSet.from_extra(config.extra)
    cli = command_line_overrides()
    call = f"{s.name}_{datetime.now(timezone.utc):%Y%m%dT%H%M%S}"
    info = machine()
    t0, spent = time.monotonic(), []
    jobs = [(f, c) for f in repeat_folders(s) for c in s.cases if not done(f / c)]
    result: dict[str, Any] = {"task": "record_set", "set": s.name, "out": str(s.out)}
    result.update({"call": call, **info, "recorded": [], "failed": [], "left": []})
    print(f"record_set {s.name}: {len(jobs)} case run(s) into {s.out} ({info['hardware']})")
    for i, (folder, case) in enumerate(jobs):
        name = f"{folder.name}/{case}"
        elapsed = time.monotonic() - t0
        if elapsed > s.max_seconds:
            result["left"].append(name)
            continue
        eta = f"{sum(spent) / len(spent) * (len(jobs) - i):.0f} s" if spent else "-"
        print(f"[{i + 1}/{len(jobs)}] {name} (elapsed {elapsed:.0f} s, ETA {eta})", flush=True)
        start = time.monotonic()
        ok, line = run_case(s, case, folder, cli)
        spent.append(time.monotonic() - start)
        print(f"  {line} ({spent[-1]:.0f} s)", flush=True)
        if ok:
            write_manifest(folder / case, s, call, case_command(s, case, folder / case, cli), info)
        result["recorded" if ok else "failed"].append(name)
    if result["left"]:
        print(f"{len(result['left'])} case run(s) left past extra.max_seconds: run it again")
    if result["failed"]:
        print(f"{len(result['failed'])} case run(s) failed: {', '.join(result['failed'])}")
    atomic_write_text(run_dir / "record_set.json", json.dumps(result, indent=2) + "\n")
    return result
