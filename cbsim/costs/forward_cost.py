"""One forward pass's cost, split by what bounds it: what CostModel.forward returns and the
simulator charges on the compute stream."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ForwardCost:
    """One forward pass on the compute stream, split by what bounds it (microseconds)."""

    linear_us: float
    lm_head_us: float
    attention_us: float
    overhead_us: float  # forward_fixed_us + per-kernel gaps
    carry_over_us: float  # the in-graph scatter-add of batch N's tokens, 0 when not needed
    kernels: int  # kernels launched (eager) or graph nodes (replay)
    # a replay's graphs (1; a piecewise one's layers + 1) and the kernels it leaves to the host
    # (a piecewise one's attention: costs/mixed_graphs.py)
    pieces: int = 1
    eager_kernels: int = 0
    # the GEMMs' compute-bound time at boost, its stretch at the settled clock ratio
    # (costs/clock.py; the simulator lags a step with prompt tokens: launch.py)
    clocked_us: float = 0.0
    clock_ratio: float = 1.0
    throttle_us: float = 0.0

    @property
    def total_us(self) -> float:
        return (
            self.linear_us
            + self.lm_head_us
            + self.attention_us
            + self.overhead_us
            + self.carry_over_us
            + self.throttle_us
        )


def roofline_us(flops: float, nbytes: float, flops_per_us: float, bytes_per_us: float) -> float:
    return max(flops / flops_per_us, nbytes / bytes_per_us)
