"""cbsim: will overlapping CPU batch preparation with GPU compute pay? Simulated and measured.

The Python API (cbsim.api): ``cbsim.simulate(*overrides)``, ``cbsim.load_sweep(dir)``,
``cbsim.load_traces(*paths)``, ``cbsim.compose(*overrides)``; loaded on first use, so importing a
part of the package (``cbsim.trace``, the runtime) does not import the simulator and plotly.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
API = ("Result", "compose", "load_sweep", "load_traces", "simulate")
__all__ = ["__version__", *API]


class _CheckoutFolders(importlib.abc.MetaPathFinder):
    """Finds cbsim.conf and cbsim.runtime in a checkout, where they are the top-level conf/ and
    runtime/ folders (an install maps them under cbsim/ through pyproject's package-dir). Without
    it, `python -m cbsim` run in the checkout root imports ./cbsim and misses the installed
    cbsim.conf."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        prefix, _, name = fullname.partition(".")
        if prefix != "cbsim" or name not in ("conf", "runtime"):
            return None
        init = self.root / name / "__init__.py"
        return importlib.util.spec_from_file_location(
            fullname, init, submodule_search_locations=[str(init.parent)]
        )


def _find_checkout_folders() -> None:
    here = Path(__file__).resolve().parent
    root = here.parent
    in_checkout = not (here / "conf").is_dir() and (root / "conf" / "__init__.py").is_file()
    if in_checkout and (root / "runtime" / "__init__.py").is_file():
        if not any(isinstance(f, _CheckoutFolders) for f in sys.meta_path):
            sys.meta_path.insert(0, _CheckoutFolders(root))


_find_checkout_folders()

if TYPE_CHECKING:
    from cbsim.api import Result, compose, load_sweep, load_traces, simulate  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in API:
        from cbsim import api

        return getattr(api, name)
    raise AttributeError(f"module 'cbsim' has no attribute {name!r}")
