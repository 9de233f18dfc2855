"""The real engine (imported as cbsim.runtime; needs the `runtime` extra: torch + transformers).

Entry point: ``run(config, engine)`` with engine "sync" or "async" returns a cbsim.trace.Trace.
torch is imported only when a run starts, so ``import cbsim.runtime`` works without it. A Ctrl-C
during a run raises ``cbsim.runtime.engine.Interrupted`` (a KeyboardInterrupt) whose ``.trace``
holds the trace recorded so far: catch it, write ``exc.trace``, and exit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cbsim.config.schema import CbsimConfig
    from cbsim.trace import Trace


def run(config: CbsimConfig, engine: str) -> Trace:
    """Run the workload on the real engine ("sync" or "async") and return its trace."""
    from .engine import execute

    return execute(config, engine).trace
