"""One profile directory, the unit a machine's profile ships and is selected as:

    DIR/hardware/<name>.yaml   a complete hardware config (hardware=DIR or hardware=<name>)
    DIR/kernels/<model>.csv    the kernel tables its kernel_table names (relative to DIR)
    DIR/probes/<probe>/trace_<engine>.json.gz   the probe runs it was fitted on
    DIR/manifest.yaml          the GPU, host, software, commit, command and each step's time

It is built in DIR.partial and renamed to DIR only when complete, so an interrupted run leaves no
half profile where a profile is expected.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from cbsim.config.schema import HardwareConfig
from cbsim.rundir import atomic_write_text

HARDWARE_DIR = "hardware"
KERNELS_DIR = "kernels"
MANIFEST = "manifest.yaml"
PARTIAL = ".partial"


def plain(value: Any) -> Any:
    """Numpy scalars as Python numbers, containers recursively (for yaml.safe_dump)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, str):
        return str(value)  # a str subclass (torch's version) as plain text
    if hasattr(value, "item"):
        return value.item()
    return value


def hardware_yaml(hw: HardwareConfig, root: Path) -> str:
    """The profile as a Hydra config of the hardware group: every field, its kernel_table
    relative to the profile directory when the tables are in it."""
    data = plain(dataclasses.asdict(hw))
    table = data.get("kernel_table")
    if (
        table
        and Path(table).is_absolute()
        and Path(table).resolve() == (root / KERNELS_DIR).resolve()
    ):
        data["kernel_table"] = KERNELS_DIR
    head = (
        f"# {hw.name}: a machine profile made by `python -m cbsim +experiment=profile_machine`;\n"
        "# select it with hardware=<this profile directory> (or hardware=<name> once installed);\n"
        "# `provenance` says of each value whether it was measured, fitted or from the base.\n"
    )
    body = yaml.safe_dump(
        {"defaults": ["hardware_schema", "_self_"], **data}, sort_keys=False, width=100
    )
    return head + body


def partial_of(out: Path) -> Path:
    return out.with_name(out.name + PARTIAL)


def start(out: Path) -> Path:
    """A fresh DIR.partial (a left-over one from an interrupted run is cleared)."""
    work = partial_of(out)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    return work


def finish(work: Path, out: Path) -> Path:
    """Rename DIR.partial to DIR (an older DIR is replaced whole)."""
    if out.exists():
        old = out.with_name(out.name + ".old")
        if old.exists():
            shutil.rmtree(old)
        os.replace(out, old)
        os.replace(work, out)
        shutil.rmtree(old)
    else:
        os.replace(work, out)
    return out


def write_hardware(root: Path, hw: HardwareConfig) -> Path:
    path = root / HARDWARE_DIR / f"{hw.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, hardware_yaml(hw, root))
    return path


def write_manifest(root: Path, manifest: dict[str, Any]) -> Path:
    path = root / MANIFEST
    atomic_write_text(path, yaml.safe_dump(plain(manifest), sort_keys=False, width=100))
    return path


def read_manifest(root: Path) -> dict[str, Any]:
    path = root / MANIFEST
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        from cbsim.config import ConfigError

        raise ConfigError(f"{path}: not a profile manifest ({exc})") from None
    return data if isinstance(data, dict) else {}


def profile_yamls(root: Path) -> list[Path]:
    """The hardware configs of a profile directory."""
    return sorted((root / HARDWARE_DIR).glob("*.yaml"))
