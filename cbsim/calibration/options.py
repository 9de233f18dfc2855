"""How thoroughly a calibration fits: the settings a quick validation trades against time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FitOptions:
    # forward spans used per trace (evenly spaced; non-decode steps take up to a quarter)
    forward_samples: int = 240
    # starts of the forward fit, the best kept: 1 (the starting profile), 2 (+ its efficiencies
    # with the other terms where the first fit ended), 3 (+ the end of a fit that held the
    # efficiencies near their start)
    starts: int = 3
    # a bar over the fit's stages (the calibrate task; off inside a validation's many fits)
    progress: bool = False
    # after the forward fit, measure gpu.decode_uneven_share over the async runs
    # (cbsim.calibration.uneven): a measurement, so off unless asked (the calibrate task)
    uneven: bool = False

    def __post_init__(self) -> None:
        if self.forward_samples < 8:
            raise ValueError(f"forward_samples={self.forward_samples}; allowed: 8 or more")
        if self.starts not in (1, 2, 3):
            raise ValueError(f"starts={self.starts}; allowed: 1, 2 or 3")
