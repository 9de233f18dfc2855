"""The GPU's SM clock under sustained GEMM load (``hardware.gpu.clock``), beside hardware.py
(which re-exports it): the kernel tables are timed at the boost clock in short bursts, but
back-to-back forwards heavy in GEMMs run into the board's power limit and the clock drops."""

from __future__ import annotations

from dataclasses import dataclass

from cbsim.config.errors import ConfigError, check_range


@dataclass
class GpuClock:
    """The clock a forward's compute-bound GEMM time runs at, as a ratio of the boost clock the
    tables were timed at (cbsim/costs/clock.py): a sustained load of a forward's GEMM rate (its
    GEMMs' FLOPs over its time at boost, a share of ``hardware.peak_flops``) below
    ``throttle_from`` runs at boost; above, the ratio settles lower, linearly down to
    ``min_ratio`` at ``throttle_full``. Not frozen: Hydra overrides a frozen node not at all.
    ``min_ratio`` 1 = no throttling."""

    # the settled clock ratio under the heaviest load (see the H200 profiles' comments for what
    # measured it)
    min_ratio: float = 1.0
    # the GEMM rate (share of peak_flops) where the clock starts to fall, and where it
    # reaches min_ratio
    throttle_from: float = 0.3
    throttle_full: float = 0.5
    # how fast the clock follows the load, milliseconds: a step with prompt tokens (tens to
    # hundreds of ms) starts from the clock the step before left; 0 = at once
    tau_ms: float = 0.0

    def __post_init__(self) -> None:
        check_range("hardware.gpu.clock.min_ratio", self.min_ratio, 0.1, 1.0)
        check_range("hardware.gpu.clock.throttle_from", self.throttle_from, 0.0, 10.0)
        check_range("hardware.gpu.clock.throttle_full", self.throttle_full, 0.0, 10.0)
        check_range("hardware.gpu.clock.tau_ms", self.tau_ms, 0.0, 1e6)
        if self.throttle_full <= self.throttle_from:
            raise ConfigError(
                f"hardware.gpu.clock.throttle_full={self.throttle_full} must be above "
                f"hardware.gpu.clock.throttle_from={self.throttle_from} (the GEMM rate, as a "
                "share of peak_flops, where the clock reaches min_ratio); allowed: "
                "0 <= throttle_from < throttle_full <= 10"
            )

    @property
    def throttles(self) -> bool:
        return self.min_ratio < 1.0
