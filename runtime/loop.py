"""The two batching loops, each in one function, in the order the brief draws them.

sync:  schedule -> prepare -> launch (H2D, forward, D2H on one stream) -> wait -> update.
async: schedule N+1 -> prepare N+1 in the other slot (its placeholders filled on the GPU by the
       carry-over) -> launch N+1 on three streams -> wait for N's D2H (the one host block per
       step) -> update N.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from .runner import ModelRunner
from .streams import SlotEvents, Streams, launch
from .recorder import Recorder, batch_args, profiler_range
from cbsim.scheduler import Scheduler, carry_over_index
from cbsim.trace import schema as S

log = logging.getLogger("cbsim.runtime")
# seconds between progress lines on long runs (the seed workload runs 80-110 s on the H200)
PROGRESS_EVERY_S = 10.0


@dataclass
class LoopState:
    runner: ModelRunner
    sched: Scheduler
    rec: Recorder
    streams: Streams
    slot_events: SlotEvents | None
    steps: int = 0
    graph_steps: int = 0
    generated: int = 0
    host_wait_s: float = 0.0
    host_phase_s: dict = field(default_factory=lambda: dict.fromkeys(S.HOST_PHASES, 0.0))
    next_progress_s: float = PROGRESS_EVERY_S

    def elapsed(self) -> float:
        return time.perf_counter() - self.rec.t0

    def schedule(self):
        t0 = self.rec.now()
        with profiler_range(S.SCHEDULE):
            batch = self.sched.schedule(t0 - self.rec.t0)
        t1 = self.rec.now()
        if batch is not None:
            args = batch_args(batch, -1)
            self.rec.host(S.SCHEDULE, t0, t1, args)
            self.rec.counters(t1, self.sched.counters())
            self.host_phase_s[S.SCHEDULE] += t1 - t0
        return batch

    def prepare_and_launch(self, batch, slot_index: int, prev=None):
        """prev: the batch in flight, whose sampled tokens fill this batch's placeholders."""
        rec = self.rec
        args = batch_args(batch, slot_index)
        t0 = rec.now()
        with profiler_range(S.PREPARE):
            carry = carry_over_index(prev, batch) if prev is not None else None
            plan = self.runner.plan(batch, self.runner.slots[slot_index], carry)
        t1 = rec.now()
        with profiler_range(S.LAUNCH):
            done = launch(self.runner, plan, self.streams, rec, self.slot_events)
        t2 = rec.now()
        rec.host(S.PREPARE, t0, t1, args)
        rec.host(S.LAUNCH, t1, t2, args)
        self.host_phase_s[S.PREPARE] += t1 - t0
        self.host_phase_s[S.LAUNCH] += t2 - t1
        self.steps += 1
        self.graph_steps += plan.bucket is not None
        return plan, done

    def wait_and_update(self, plan, done) -> None:
        rec, batch = self.rec, plan.batch
        args = batch_args(batch, plan.slot.index)
        t0 = rec.now()
        if done is not None:
            with profiler_range(S.WAIT):
                done.synchronize()
        t1 = rec.now()
        with profiler_range(S.UPDATE):
            tokens = self.runner.tokens(plan)
            finished = self.sched.update(batch, tokens)
        t2 = rec.now()
        rec.host(S.WAIT, t0, t1, args)
        rec.host(S.UPDATE, t1, t2, args)
        self.host_phase_s[S.WAIT] += t1 - t0
        self.host_phase_s[S.UPDATE] += t2 - t1
        kept = self.sched.last_num_kept  # outputs sampled after a request's EOS are dropped
        self.generated += kept
        if kept != len(tokens) and plan.forward_args is not None:
            plan.forward_args["new_tokens"] = kept
        if t2 - rec.t0 >= self.next_progress_s:
            self.next_progress_s += PROGRESS_EVERY_S
            log.info(
                "step %d: %d tokens, %d requests unfinished, %.0f s",
                self.steps,
                self.generated,
                self.sched.num_unfinished,
                t2 - rec.t0,
            )
        if rec.enabled:
            for rid in self.sched.last_first_token_rids:
                rec.request(S.FIRST_TOKEN, t2, rid, step=int(batch.step))
            for rid in finished:
                state = self.sched.request(rid)
                rec.request(
                    S.FINISH,
                    t2,
                    rid,
                    tokens=state.num_outputs,
                    reason=state.finish_reason,
                    step=int(batch.step),
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
