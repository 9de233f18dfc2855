"""The two batching loops, each in one function, in the order the brief draws them.

sync:  schedule -> prepare -> launch (H2D, forward, D2H on one stream) -> wait -> update.
async: schedule N+1 -> prepare N+1 in the other slot (its placeholders filled on the GPU by the
       carry-over) -> launch N+1 on three streams -> wait for N's D2H (the one host block per
       step) -> update N.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from time import perf_counter

from cbsim.scheduler import Scheduler, carry_over_index
from cbsim.trace import schema as S

from .recorder import Recorder, profiler_range
from .runner import ModelRunner, StepPlan
from .streams import EventRing, Streams, launch

log = logging.getLogger("cbsim.runtime")
# seconds between progress lines on long runs (the seed workload runs 80-110 s on the H200)
PROGRESS_EVERY_S = 10.0


@dataclass
class LoopState:
    runner: ModelRunner
    sched: Scheduler
    rec: Recorder
    streams: Streams
    events: EventRing | None
    steps: int = 0
    graph_steps: int = 0
    mixed_graph_steps: int = 0  # of those, steps with prompt tokens replayed piecewise
    generated: int = 0
    next_progress_s: float = PROGRESS_EVERY_S

    def elapsed(self) -> float:
        return perf_counter() - self.rec.t0

    def schedule(self):
        t0 = perf_counter()
        with profiler_range(S.SCHEDULE):
            batch = self.sched.schedule(t0 - self.rec.t0)
        if batch is not None:
            self.rec.scheduled(batch, t0, perf_counter(), self.sched)
        return batch

    def prepare_and_launch(self, batch, slot_index: int, prev=None) -> tuple[StepPlan, object]:
        """prev: the batch in flight, whose sampled tokens fill this batch's placeholders."""
        row = int(batch.step)
        t0 = perf_counter()
        with profiler_range(S.PREPARE):
            carry = carry_over_index(prev, batch) if prev is not None else None
            plan = self.runner.plan(batch, self.runner.slots[slot_index], carry)
        t1 = perf_counter()
        ev = self.events.get(row) if self.events is not None else None
        with profiler_range(S.LAUNCH):
            done = launch(self.runner, plan, self.streams, ev, self.rec, row)
        self.rec.launched(row, slot_index, t0, t1, perf_counter(), plan)
        self.steps += 1
        self.graph_steps += plan.pieces > 0
        self.mixed_graph_steps += plan.tokens_bucket is not None
        return plan, done

    def wait_and_update(self, plan: StepPlan, done) -> None:
        rec, batch = self.rec, plan.batch
        row = int(batch.step)
        t0 = perf_counter()
        if done is not None:
            with profiler_range(S.WAIT):
                done.synchronize()
        t1 = perf_counter()
        with profiler_range(S.UPDATE):
            finished = self.sched.update(batch, self.runner.tokens(plan))
            if self.events is not None and self.events.timing:
                rec.resolve(row, self.events.get(row))
        t2 = perf_counter()
        kept = self.sched.last_num_kept  # outputs sampled after a request's EOS are dropped
        rec.updated(row, t0, t1, t2, kept)
        self.generated += kept
        if self.sched.last_first_token_rids:
            rec.first_token(t2, self.sched.last_first_token_rids, row)
        for rid in finished:  # counts only: a snapshot copies the outputs (0.1-18 ms a step)
            rec.finished(t2, rid, row, self.sched.num_outputs(rid), self.sched.finish_reason(rid))
        if t2 - rec.t0 >= self.next_progress_s:
            self.next_progress_s += PROGRESS_EVERY_S
            log.info(
                "step %d: %d tokens, %d requests unfinished, %.0f s",
                self.steps,
                self.generated,
                self.sched.num_unfinished,
                t2 - rec.t0,
            )

    def idle(self) -> None:
        """Nothing can run and nothing is in flight: sleep until the next request arrives."""
        gap = self.sched.next_arrival_s() - self.elapsed()
        if gap > 0:
            time.sleep(min(gap, 0.05))


def run_sync(s: LoopState) -> None:
    """The baseline: the host waits for every step."""
    while s.sched.has_unfinished():
        batch = s.schedule()
        if batch is None:
            s.idle()
            continue
        plan, done = s.prepare_and_launch(batch, 0)
        s.wait_and_update(plan, done)


def run_async(s: LoopState) -> None:
    """Batch N+1 is prepared and enqueued while the GPU runs batch N; one host block per step."""
    inflight = None  # (plan, d2h_done) of batch N
    k = 0  # batches launched; batch k uses slot k % 2
    while s.sched.has_unfinished():
        batch = s.schedule()
        launched = None
        if batch is not None:
            launched = s.prepare_and_launch(batch, k % 2, inflight[0].batch if inflight else None)
            k += 1
        if inflight is not None:
            s.wait_and_update(*inflight)
        elif launched is None:
            s.idle()
        inflight = launched
