"""cbsim's Hydra plugins: the sweeper (hydra/sweeper=cbsim) and the launcher (hydra/launcher=
local and parallel), the defaults of every cbsim sweep. Hydra instantiates plugins only from the
hydra_plugins namespace, so the classes are named here; their code lives in cbsim.sweep.

Hydra finds plugins by scanning this namespace, which an editable install hides from the scan;
``register()`` (called by the sweep's callback before Hydra instantiates them) registers them
through Hydra's own ``Plugins.register``, so every install works the same.
"""

from hydra.core.plugins import Plugins

from cbsim.sweep.launcher import BatchedLauncher as _Launcher
from cbsim.sweep.sweeper import PrecomposedSweeper as _Sweeper


class PrecomposedSweeper(_Sweeper):
    """The basic sweeper, trusting the job configs cbsim.preflight composed and checked."""


class BatchedLauncher(_Launcher):
    """Jobs in this process or in joblib worker processes, a batch per task."""


def register() -> None:
    for plugin in (PrecomposedSweeper, BatchedLauncher):
        Plugins.instance().register(plugin)


__all__ = ["BatchedLauncher", "PrecomposedSweeper", "register"]
