"""cbsim: will overlapping CPU batch preparation with GPU compute pay? Simulated and measured.

The Python API (cbsim.api): ``cbsim.simulate(*overrides)``, ``cbsim.load_sweep(dir)``,
``cbsim.load_traces(*paths)``, ``cbsim.compose(*overrides)``; loaded on first use, so importing a
part of the package (``cbsim.trace``, the runtime) does not import the simulator and plotly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
API = ("Result", "compose", "load_sweep", "load_traces", "simulate")
__all__ = ["__version__", *API]

if TYPE_CHECKING:
    from cbsim.api import Result, compose, load_sweep, load_traces, simulate  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in API:
        from cbsim import api

        return getattr(api, name)
    raise AttributeError(f"module 'cbsim' has no attribute {name!r}")
