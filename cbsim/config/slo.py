"""Service-level objectives (the ``slo`` group): the bounds goodput and capacity hold runs to."""

from __future__ import annotations

from dataclasses import dataclass, field

from cbsim.config.ranges import POSITIVE


@dataclass
class SloConfig:
    """Service-level objectives for goodput (cbsim/metrics/serving.py): a finished request is
    good when it meets every bound set (None: no bound), as vLLM's ``bench serve --goodput``."""

    ttft_ms: float | None = field(default=None, metadata=POSITIVE)
    tpot_ms: float | None = field(default=None, metadata=POSITIVE)
    e2el_ms: float | None = field(default=None, metadata=POSITIVE)
    # offered over sustained request rate above which the engine does not keep up (metric
    # ``overloaded``): a 10% margin over the rate noise of a finite Poisson run
    overload_ratio: float = field(default=1.1, metadata=POSITIVE)
