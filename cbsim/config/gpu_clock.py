"""The GPU's SM clock under sustained decode load (``hardware.gpu.clock``), beside hardware.py
(which re-exports it): the kernel tables are timed at the boost clock in short bursts, but
back-to-back decode steps heavy in GEMMs run into the board's power limit and the clock drops."""

from __future__ import annotations

from dataclasses import dataclass

from cbsim.config.errors import ConfigError, check_range


@dataclass
class GpuClock:
    """The clock a decode step's compute-bound GEMM time runs at, as a ratio of the boost
    clock the tables were timed at (cbsim/costs/clock.py): a step's GEMM rate (its GEMMs'
    FLOPs over its time at boost, a share of ``hardware.peak_flops``) below ``throttle_from``
    runs at boost; above, the ratio falls linearly to ``min_ratio`` at ``throttle_full``. Not
    frozen: Hydra overrides a frozen node not at all. ``min_ratio`` 1 = no throttling."""

    # the settled clock ratio under the heaviest decode load (see the H200 profiles' comments
    # for what measured it)
    min_ratio: float = 1.0
    # the GEMM rate (share of peak_flops) where the clock starts to fall, and where it
    # reaches min_ratio
    throttle_from: float = 0.3
    throttle_full: float = 0.5

    def __post_init__(self) -> None:
        check_range("hardware.gpu.clock.min_ratio", self.min_ratio, 0.1, 1.0)
        check_range("hardware.gpu.clock.throttle_from", self.throttle_from, 0.0, 10.0)
        check_range("hardware.gpu.clock.throttle_full", self.throttle_full, 0.0, 10.0)
        if self.throttle_full <= self.throttle_from:
            raise ConfigError(
                f"hardware.gpu.clock.throttle_full={self.throttle_full} must be above "
                f"hardware.gpu.clock.throttle_from={self.throttle_from} (the GEMM rate, as a "
                "share of peak_flops, where the clock reaches min_ratio)"
            )

    @property
    def throttles(self) -> bool:
        return self.min_ratio < 1.0
