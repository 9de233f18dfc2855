"""A steady stretch's data: its steps' costs (fast_forward.py computes them) and what each step
did (stretch_loop.py's timeline), read by stretch_record.py and stretch_state.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class StretchCosts:
    """Per step of a stretch (lists of Python numbers, step order)."""

    kv_tokens: list[int]  # of the batch launched at each step
    schedule: list[float]
    prepare: list[float]
    update: list[float]  # of the batch updated at each step (async: the one before)
    h2d: list[float]
    h2d_bytes: list[int]
    stage: list[float]  # launch_per_block_us x the batch's block-table entries
    forward: list[float]
    opened: np.ndarray  # KV blocks each step's schedule opens
    last_forward: object  # the ForwardCost of the last step (for its Launched)
    graph: bool  # every step one graph replay (else its kernels launched eagerly)
    kernels: int  # kernels (graph nodes) of each step's forward
    carry_us: float  # the carry-over's time inside each forward (0 without)
    factor: float  # the host's speed factor (host_speed.py), one level for the whole stretch
    clock_ratio: list[float] = field(default_factory=list)  # each forward's settled SM clock


@dataclass
class Timeline:
    """What each step of the stretch did, in step order (microseconds)."""

    sched: list[float] = field(default_factory=list)  # schedule starts
    prep: list[float] = field(default_factory=list)
    launch: list[float] = field(default_factory=list)
    launch_dur: list[float] = field(default_factory=list)
    wait: list[float] = field(default_factory=list)
    wait_dur: list[float] = field(default_factory=list)
    update: list[float] = field(default_factory=list)
    update_dur: list[float] = field(default_factory=list)  # update cost + stall
    stall: list[float] = field(default_factory=list)
    h2d: list[tuple[float, float]] = field(default_factory=list)  # (start, end)
    compute: list[tuple[float, float]] = field(default_factory=list)
    forward: list[float] = field(default_factory=list)  # busy time on the stream
    d2h: list[tuple[float, float]] = field(default_factory=list)
    now: float = 0.0  # the host's clock after the stretch

    @property
    def steps(self) -> int:
        return len(self.sched)

    def truncate(self, k: int) -> None:
        """Keep the first ``k`` steps (the clock after them)."""
        if k == self.steps:
            return
        self.now = self.sched[k]  # where the first dropped step would have started
        for name in ("sched", "prep", "launch", "launch_dur", "wait", "wait_dur", "update"):
            del getattr(self, name)[k:]
        for name in ("update_dur", "stall", "h2d", "compute", "forward", "d2h"):
            del getattr(self, name)[k:]
