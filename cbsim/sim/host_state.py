"""What the simulated host thread holds and counts: the scheduler, the cost model, the host's
speed, the device (streams), the launch queue, the IO slots, the recorder, the batches it
launched, its counters.

host_phases.py adds the phases that change it; launch.py and the fast-forward (fast_forward.py
and the stretch modules) work on it too.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from cbsim.config.schema import CbsimConfig
from cbsim.run_setup import RunSetup
from cbsim.scheduler import Batch
from cbsim.sim.clock import Clock
from cbsim.sim.host_speed import HostSpeed
from cbsim.sim.io_slots import IOSlot, SlotTracker
from cbsim.sim.recorder import CHUNK_SPANS, Recorder
from cbsim.sim.streams import CudaEvent, Device, LaunchQueue, Op
from cbsim.sim.tokens import Sampler
from cbsim.trace import TraceBuilder
from cbsim.trace import schema as S


@dataclass(slots=True)
class Launched:
    """A batch on the GPU: its slot, its three stream ops and the event the host waits on."""

    batch: Batch
    slot: IOSlot
    args: dict[str, Any]
    h2d: Op
    compute: Op
    d2h: Op
    d2h_done: CudaEvent
    forward_args: dict[str, Any]  # the forward span's args: new_tokens is settled in update
    step: int


class HazardLog(Counter):
    """Hazards by kind, each also recorded (kept off HostPhases: no reference cycle holds the
    trace alive after the run)."""

    def __init__(self, rec: Recorder) -> None:
        super().__init__()
        self.rec = rec

    def __call__(self, kind: str, lane: str, ts: float, step: int, slot: int, detail: str) -> None:
        self.rec.hazard(lane, ts, kind, step, slot, detail)
        self[kind] += 1


class HostState:
    """One simulated run's host thread: what it holds and counts (its phases: HostPhases)."""

    def __init__(
        self,
        config: CbsimConfig,
        setup: RunSetup,
        trace: TraceBuilder | None,
        chunk: int = CHUNK_SPANS,
        window: int | None = None,
    ) -> None:
        """``chunk``: without a trace, the spans folded at a time; ``window``: the width in
        steps of the windows of spans kept for the report (cbsim.sim.recorder)."""
        self.config, self.engine, self.trace = config, setup.engine, trace
        self.env = Clock()
        w = config.workload
        self.requests = setup.requests
        self.costs = setup.costs
        self.speed = HostSpeed.of(config.hardware.host)  # every host cost times its factor
        self.sampler = Sampler(self.requests, w.ignore_eos, config.model.vocab_size, w.batch_size)
        self.sched = setup.scheduler
        self.device = Device(self.engine.streams, config.hardware.gpu.forward_gap_us)
        self.launch_queue = LaunchQueue(config.hardware.gpu.launch_queue_depth)
        self.rec = Recorder(trace, (S.HOST, *self.device.lanes), chunk, window)
        self._last_counters: dict[str, int] = {}
        self._prepared: dict[str, Any] | None = None  # span args of the batch last prepared
        self._asked_us = 0.0  # when the last schedule phase asked the scheduler (host_phases.py)
        # by scheduler row: whether the request's "scheduled" instant is written
        self._admitted = np.zeros(self.sched.table.n, dtype=bool)
        self.hazards = HazardLog(self.rec)
        self.slots = SlotTracker(setup.io_slots, self.hazards)
        self.launches = 0
        self.launch_hosts: dict[float, Any] = {}  # launch.launch_host: LaunchHost per factor
        # (slot, bucket, table width) graphs launched
        self.replayed: set[tuple[int, int | None, int | None]] = set()
        self.last_updated: Launched | None = None
        self.host_us: Counter[str] = Counter()
        self.lane_busy_us: Counter[str] = Counter()
        self.n = Counter()  # steps, tokens, blocks, graph/eager steps, ...
        self.fast_forward_on = True  # steady stretches at once (fast_forward.py)
        for a in setup.arrivals():
            self.rec.request_event(
                S.ARRIVAL,
                a.arrival_s * 1e6,
                a.rid,
                prompt_len=a.prompt_len,
                max_new_tokens=a.max_new_tokens,
            )

    def next_slot(self) -> IOSlot:
        return self.slots.slot_for(self.launches)
