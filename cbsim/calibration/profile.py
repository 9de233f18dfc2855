"""Write a calibrated hardware profile as a Hydra config file, with a provenance entry per value
saying where it came from: fitted (on how many spans, at what residual), measured, or kept. It goes to the run directory;
installed (when asked) into the user's config directory, which conf/config.yaml's
hydra.searchpath names, so ``hardware=<name>`` selects it from then on."""

from __future__ import annotations

import dataclasses
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


# fields that describe the profile itself: no provenance entry
SELF_DESCRIBED = ("name", "source", "provenance", "tier")


def provenance(cal: Calibration, base_name: str) -> dict[str, str]:
    """Dotted key -> where the value came from, for every value of the profile: a stage's own
    measurement (cal.provenance), a row of the fit (fitted, or kept as not identifiable), or
    the base profile, whose own entry for it is carried."""
    hw, origin, base = cal.hardware, _origin(cal), cal.hardware.provenance
    out: dict[str, str] = {}

    def of(full: str, short: str, key: str) -> str:
        if full in cal.provenance:
            return cal.provenance[full]
        note = origin.get(ROW_ALIASES.get(short, short), "")
        if note.startswith("fitted"):
            return note
        carried = f": {base[full]}" if full in base else ""
        if note:  # kept: not identifiable
            return f"kept from hardware={base_name} ({note.split('(', 1)[1]}{carried}"
        if key in ("copy_launch_us", "event_us") and not carried:
            carried = ": a launch span shows only the sum (see host.graph_launch_us)"
        return f"from hardware={base_name}{carried}"

    def walk(obj, path: str, prefix: str) -> None:
        for f in dataclasses.fields(obj):
            value, full = getattr(obj, f.name), path + f.name
            if dataclasses.is_dataclass(value):
                walk(value, full + ".", f"{f.name}." if f.name in HOST_PHASES else "")
            elif f.name not in SELF_DESCRIBED or path:
                out[full] = of(full, prefix + f.name, f.name)

    walk(hw, "", "")
    return out


def profile_yaml(cal: Calibration, base_name: str) -> str:
    """Every HardwareConfig field (so a field added to the schema later is carried over too),
    then ``provenance``: one entry per value saying where it came from."""
    hw = cal.hardware
    traces = ", ".join(cal.traces)
    lines = [
        f"# {hw.name}: written by `python -m cbsim +experiment=calibrate` from hardware={base_name}",
        "# (a term the traces cannot determine keeps its value there); each value's origin is in",
        "# `provenance`. Select it with hardware=" + hw.name + ".",
        *(f"# note: {n}" for n in cal.notes),
        "defaults:",
        "  - hardware_schema",
        "  - _self_",
    ]
    source = (
        f"fitted by python -m cbsim +experiment=calibrate from hardware={base_name} on "
        f"{len(cal.traces)} runtime trace(s): {traces}"
    )

    def emit(obj, indent: str) -> None:
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.name == "provenance":
                continue
            if dataclasses.is_dataclass(value):
                lines.append(f"{indent}{f.name}:")
                emit(value, indent + "  ")
            elif f.name == "source" and not indent:
                lines.append(f"source: {json.dumps(source)}")
            else:
                lines.append(f"{indent}{f.name}: {_scalar(value)}")

    emit(hw, "")
    lines.append("provenance:")
    lines += [f"  {k}: {json.dumps(v)}" for k, v in provenance(cal, base_name).items()]
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
