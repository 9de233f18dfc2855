"""``hardware=<profile directory>``, ``hardware=<name of a profile directory>`` and
``hardware=auto`` on the command line, rewritten before Hydra composes: the profile directory
becomes a config root on the search path (it holds hardware/<name>.yaml) and the override
``hardware=<name>``; a relative kernel_table in that yaml is resolved against the directory.

Profile directories are found by name under the user's config directory (profiles/<name>/, in
$CBSIM_CONFIG_DIR, else ~/.config/cbsim) and those shipped with cbsim (cbsim/profiles/<name>/).
``hardware=auto`` picks the one whose device_name is the GPU found, ranked by tier (profiled,
fitted, datasheet, estimate), the user's own first at a tier.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from cbsim.calibration.profile import user_config_dir
from cbsim.config import ConfigError
from cbsim.config.hardware import TIERS
from cbsim.config.shipped_profiles import shadow, shipped_root
from cbsim.profiling.profile_dir import HARDWARE_DIR, profile_yamls

SHIPPED_PROFILES = Path(str(resources.files("cbsim") / "profiles"))
PROFILES = "profiles"


@dataclass(frozen=True)
class Found:
    root: Path
    yaml: Path
    name: str
    device_name: str
    tier: str
    user: bool


def profile_roots() -> list[tuple[Path, bool]]:
    """Every profile directory known by name: the user's, then the shipped ones."""
    out = []
    for base, user in ((user_config_dir() / PROFILES, True), (SHIPPED_PROFILES, False)):
        if base.is_dir():
            out += [(d, user) for d in sorted(base.iterdir()) if (d / HARDWARE_DIR).is_dir()]
    return out


def read_profile(root: Path, user: bool) -> Found:
    """The one hardware config of a profile directory."""
    yamls = profile_yamls(root)
    if len(yamls) != 1:
        found = ", ".join(p.name for p in yamls) or "none"
        raise ConfigError(
            f"hardware={root}: a profile directory holds one {HARDWARE_DIR}/<name>.yaml "
            f"(found {found}); allowed: a directory written by +experiment=profile_machine"
        )
    try:
        data = yaml.safe_load(yamls[0].read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"hardware={root}: {yamls[0]} is not readable ({exc})") from None
    return Found(
        root.resolve(),
        yamls[0],
        yamls[0].stem,
        str(data.get("device_name") or ""),
        str(data.get("tier") or ""),
        user,
    )


def looks_like_path(value: str) -> bool:
    return os.sep in value or value.startswith((".", "~")) or Path(value).is_dir()


def auto_profile(device_name: str) -> Found:
    """The best profile of ``device_name``: by tier, the user's first at a tier."""
    found = []
    for root, user in profile_roots():
        try:
            p = read_profile(root, user)
        except ConfigError:
            continue
        if p.device_name == device_name:
            found.append(p)
    if not found:
        raise ConfigError(
            f"hardware=auto: no profile of {device_name!r} (in {user_config_dir() / PROFILES} or "
            "shipped); make one with python -m cbsim +experiment=profile_machine mode=runtime "
            "extra.out=DIR, or pick hardware=<name or profile directory>"
        )
    rank = {t: i for i, t in enumerate(TIERS)}
    return min(found, key=lambda p: (rank.get(p.tier, len(TIERS)), not p.user))


def gpu_name() -> str:
    """The first CUDA device's name as torch reports it."""
    try:
        import torch
    except ImportError:
        raise ConfigError(
            "hardware=auto reads the GPU with torch: install cbsim[runtime]"
        ) from None
    if not torch.cuda.is_available():
        raise ConfigError(
            "hardware=auto picks the profile of the GPU this runs on, and no CUDA device is "
            "visible; allowed here: hardware=<name or profile directory>"
        )
    return torch.cuda.get_device_name(0)


def resolve(value: str) -> Found | None:
    """The profile directory ``hardware=value`` names, or None for a hardware config name."""
    if value == "auto":
        p = auto_profile(gpu_name())
        print(f"cbsim: hardware=auto: {p.name} ({p.tier or 'no tier'}, {p.root})", file=sys.stderr)
        return p
    if looks_like_path(value):
        root = Path(value).expanduser()
        if not root.is_dir():
            raise ConfigError(f"hardware={value}: no such profile directory")
        return read_profile(root, True)
    for root, user in profile_roots():
        if root.name == value:
            return read_profile(root, user)
    return None


def rewrite(args: list[str]) -> list[str]:
    """The command line with any hardware=<profile directory | its name | auto> rewritten into
    a search-path entry and hardware=<name> (and an absolute kernel_table)."""
    out, roots = [], []
    shadow(set())
    for arg in args:
        key, sep, value = arg.partition("=")
        found = resolve(value) if sep and key == "hardware" else None
        if found is None:
            out.append(arg)
            continue
        roots.append(found.root)
        if found.root != shipped_root(found.name):
            shadow({found.name})
        out.append(f"hardware={found.name}")
        table = (yaml.safe_load(found.yaml.read_text()) or {}).get("kernel_table")
        if isinstance(table, str) and not Path(table).is_absolute():
            if (found.root / table).exists():
                out.append(f"hardware.kernel_table='{found.root / table}'")
    if not roots:
        return args
    paths = [f"'file://{r}'" for r in roots] + [f"'file://{user_config_dir()}'"]
    return [*out, f"hydra.searchpath=[{','.join(paths)}]"]
