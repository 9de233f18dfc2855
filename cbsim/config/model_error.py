"""The simulator's own error on runs no fit has seen (``hardware.model_error``), beside
hardware.py (which re-exports it): what the bands add to the spread their draws give."""

from __future__ import annotations

from dataclasses import dataclass

from cbsim.config.errors import check_range

METRICS = ("total_time", "gpu_idle", "speedup")


@dataclass
class ModelError:
    """How far the simulator misses on held-out runs beyond what its draws vary (host speed, the
    host's levels, step jitter, the forward model's error): a band (cbsim/bands.py) widens each
    P5-P95 interval by it, in quadrature on the metric's own scale, so the band says how sure
    the prediction is and not only how much the host moves it. Each is a standard deviation;
    `+experiment=validate` prints, for its held-out runs, the smallest values with which 90% of
    them would lie inside their bands (split conformal). A profile carries the values measured
    on other runs than those it is judged on. 0 = the draws alone."""

    # log of the total time (0.02: about 2%)
    total_time: float = 0.0
    # logit of the GPU idle fraction, i.e. log of idle time over busy time (0.3: about x1.35)
    gpu_idle: float = 0.0
    # log of the async speedup, sync total over async total
    speedup: float = 0.0

    def __post_init__(self) -> None:
        for metric in METRICS:
            check_range(f"hardware.model_error.{metric}", getattr(self, metric), 0.0, 5.0)

    @property
    def any(self) -> bool:
        return any(getattr(self, m) > 0 for m in METRICS)
