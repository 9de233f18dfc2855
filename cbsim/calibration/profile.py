"""Write a calibrated hardware profile as a Hydra config file, every value commented with where it
came from: fitted (on how many spans, at what residual) or kept. It goes to the run directory;
installed (when asked) into the user's config directory, which conf/config.yaml's
hydra.searchpath names, so ``hardware=<name>`` selects it from then on."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
from importlib import resources
from pathlib import Path

import yaml

from cbsim.calibration.result import Calibration
from cbsim.config.errors import ConfigError
from cbsim.rundir import atomic_write_text

# the shipped presets (never shadowed) and the variable naming the user's profile directory
CONF_HARDWARE = Path(str(resources.files("cbsim.conf") / "hardware"))
USER_CONFIG_ENV = "CBSIM_CONFIG_DIR"
HOST_PHASES = ("schedule", "prepare", "update")
# what each fitted term is called in the residual rows (us_per_byte_* map to bandwidths)
ROW_ALIASES = {"h2d_bandwidth": "us_per_byte_h2d", "d2h_bandwidth": "us_per_byte_d2h"}


def _origin(cal: Calibration) -> dict[str, str]:
    """Field path -> comment, from the residual rows."""
    out: dict[str, str] = {}
    for row in cal.rows:
        for term, fitted in row.fit.fitted.items():
            note = (
                f"fitted: {row.what}, {row.samples} spans, rms {row.fit.rms_pct:.2f}%"
                if fitted
                else f"kept from the base profile ({row.what}: not identifiable)"
            )
            phase = row.what.split()[0]
            prefix = f"{phase}." if phase in HOST_PHASES else ""
            out[prefix + term] = note
    return out


def _scalar(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) or hasattr(value, "dtype"):
        value = float(value)
        return f"{value:.6g}" if value != 0 else "0.0"
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def profile_yaml(cal: Calibration, base_name: str) -> str:
    """Every HardwareConfig field (so a field added to the schema later is carried over too),
    each commented with its origin."""
    hw, origin = cal.hardware, _origin(cal)
    traces = ", ".join(cal.traces)
    lines = [
        f"# {hw.name}: calibrated by `python -m cbsim +experiment=calibrate` on "
        f"{_dt.date.today().isoformat()}",
        f"# from {len(cal.traces)} trace(s): {traces}",
        f"# starting from (and, for terms the traces cannot determine, keeping) hardware={base_name}.",
        "# Select it with hardware=" + hw.name + "; docs/validation.md says how it was fitted.",
        *(f"# note: {n}" for n in cal.notes),
        "defaults:",
        "  - hardware_schema",
        "  - _self_",
    ]

    def note_of(key: str, path: str) -> str:
        note = origin.get(ROW_ALIASES.get(path, path), "")
        if note or key in ("name", "source"):
            return note
        if key in ("copy_launch_us", "event_us"):
            return (
                f"from hardware={base_name}: a launch span shows only the sum (see graph_launch_us)"
            )
        return f"from hardware={base_name}"

    def emit(obj, indent: str, prefix: str) -> None:
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                lines.append(f"{indent}{f.name}:")
                emit(value, indent + "  ", f"{f.name}." if f.name in HOST_PHASES else "")
                continue
            if f.name == "source":
                value = f"calibrated from {len(cal.traces)} runtime trace(s): {traces}"
                lines.append(f"{indent}source: {json.dumps(value)}")
                continue
            note = note_of(f.name, prefix + f.name)
            lines.append(f"{indent}{f.name}: {_scalar(value)}" + (f"  # {note}" if note else ""))

    emit(hw, "", "")
    return "\n".join(lines) + "\n"


def user_config_dir() -> Path:
    """$CBSIM_CONFIG_DIR, else ~/.config/cbsim: the directory conf/config.yaml's
    hydra.searchpath adds, so its hardware/<name>.yaml is selectable as hardware=<name>."""
    value = os.environ.get(USER_CONFIG_ENV)
    return Path(value).expanduser() if value else Path.home() / ".config" / "cbsim"


def write_profile(cal: Calibration, base_name: str, run_dir: Path, install: bool) -> list[Path]:
    """<run_dir>/<name>.yaml, and <user config dir>/hardware/<name>.yaml too when ``install``."""
    name = cal.hardware.name
    if not name.replace("_", "").replace("-", "").isalnum():
        raise ConfigError(f"extra.profile={name!r}: use letters, digits, '_' and '-' only")
    text = profile_yaml(cal, base_name)
    paths = [Path(run_dir) / f"{name}.yaml"]
    if install:
        if (CONF_HARDWARE / f"{name}.yaml").exists():
            raise ConfigError(
                f"extra.profile={name}: a shipped preset has that name (it would shadow the "
                "installed one); pick another name, e.g. extra.profile=h200_mine"
            )
        paths.append(user_config_dir() / "hardware" / f"{name}.yaml")
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(p, text)
    return paths
