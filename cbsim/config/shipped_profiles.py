"""The profile directories cbsim ships (cbsim/profiles/<name>/, each written by
+experiment=profile_machine or +experiment=datasheet_profiles) as Hydra config roots, so
``hardware=<name>`` selects one anywhere a hardware option is named: on the command line, in
an experiment preset's defaults list, in a sweep. A profile's relative ``kernel_table`` is
its own directory's (HardwareConfig resolves it by the profile's name).
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.plugins import Plugins
from hydra.plugins.search_path_plugin import SearchPathPlugin

from cbsim.config.errors import ConfigError

SHIPPED = Path(__file__).resolve().parents[1] / "profiles"
REPO = Path(__file__).resolve().parents[2]
# names a command line selects from another directory (hardware=<path>, the user's profiles):
# Hydra searches the plugin's roots before the command line's, so these shipped ones step aside
_shadowed: set[str] = set()


def shipped_roots() -> list[Path]:
    """Every shipped profile directory (one holding hardware/<name>.yaml), by name."""
    if not SHIPPED.is_dir():
        return []
    return [d for d in sorted(SHIPPED.iterdir()) if (d / "hardware").is_dir()]


def shipped_root(name: str) -> Path | None:
    """The shipped profile directory whose hardware yaml is ``name``, if any."""
    return next((d for d in shipped_roots() if (d / "hardware" / f"{name}.yaml").is_file()), None)


def shadow(names: set[str]) -> None:
    """The shipped profiles of these names leave the search path of the commands composed from
    now on: a profile of the same name elsewhere was selected (a user's profile of an H100 is
    named as the shipped one is), and Hydra would otherwise find the shipped one first."""
    _shadowed.clear()
    _shadowed.update(names)


class ShippedProfiles(SearchPathPlugin):
    """Appends each shipped profile directory to Hydra's config search path."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        for root in shipped_roots():
            if not any((root / "hardware" / f"{n}.yaml").is_file() for n in _shadowed):
                search_path.append(provider="cbsim-profiles", path=f"file://{root}")


def register_search_path() -> None:
    Plugins.instance().register(ShippedProfiles)


def kernel_table_files(path: str, profile: str | None = None) -> list[Path]:
    """The CSV files ``hardware.kernel_table`` names: a file, or every ``*.csv`` of a directory;
    a relative path is tried against the directory of the shipped profile named ``profile``
    (a profile's tables are its own), then the working directory, then the repository root."""
    p = Path(path)
    root = shipped_root(profile) if profile and not p.is_absolute() else None
    tried = [p] if p.is_absolute() else [Path.cwd() / p, REPO / p]
    tried = ([root / p] if root is not None else []) + tried
    for cand in tried:
        if cand.is_file():
            return [cand]
        if cand.is_dir() and (files := sorted(cand.glob("*.csv"))):
            return files
    raise ConfigError(
        f"hardware.kernel_table={path!r}: no table there (tried {', '.join(map(str, tried))}); "
        "allowed: a kernel-table CSV written by +experiment=profile_kernels, or a directory of them"
    )
