"""The host thread's phases, which the loops in loop.py are written in.

Each phase is a generator the host process ``yield from``s: it costs host time (costs.py, times
the host's speed factor when the phase starts: host_speed.py), writes its span, and touches the
streams and IO slots (the launch phase's stream work: launch.py). Time is in microseconds; the
shared scheduler sees seconds. The scheduler is cbsim.scheduler, the very
one the runtime drives, built by cbsim.run_setup as the runtime's is.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import simpy

from cbsim.scheduler import Batch
from cbsim.sim.fast_forward import fast_forward
from cbsim.sim.host_state import HostState, Launched
from cbsim.sim.io_slots import IOSlot
from cbsim.sim.launch import StepPlan, enqueue_step, plan_step
from cbsim.sim.streams import Op, happens_before
from cbsim.trace import NO_BATCH, batch_args
from cbsim.trace import schema as S


class HostPhases(HostState):
    """The host thread's phases (host_state.py holds what they change)."""

    # ---- helpers ---------------------------------------------------------------------------
    def _phase(self, name: str, dur: float, args: dict[str, Any]) -> simpy.Timeout:
        env = self.env
        self.rec.host_span(name, env.now, dur, args)
        self.host_us[name] += dur
        return env.timeout(dur)

    def _gpu_span(
        self, lane: str, name: str, start: float, dur: float, args: dict[str, Any]
    ) -> None:
        self.rec.span(lane, name, start, dur, args)
        self.lane_busy_us[lane] += dur

    # ---- host phases -----------------------------------------------------------------------
    def loop_start(self):
        """The loop's cold start (hardware.host.loop_start_us), before the first schedule, as
        host time without a span: in the runtime it is the trace anchor before the first span
        and the first step's phases running longer than their steady cost."""
        start = self.config.hardware.host.loop_start_us
        if start > 0:
            yield self.env.timeout(start * self.speed.factor_at(self.env.now))

    def steady_stretch(self, inflight: Launched | None):
        """The steady decode steps ahead, all at once and exactly (fast_forward.py), if any;
        returns the batch in flight after them (async) or ``inflight``."""
        return (yield from fast_forward(self, inflight))

    def schedule(self):
        """Ask the shared scheduler for the next batch (None: nothing can run now)."""
        now = self._asked_us = self.env.now  # when the scheduler saw the queue
        self.rec.fold_before(now)  # without a trace: what started before now, folded
        # us -> s round-off: a few ulps relative (arrival_s * 1e6 * 1e-6 can fall below
        # arrival_s by more than any fixed slack once arrivals pass ~1e4 s) plus 1 ps near 0
        batch = self.sched.schedule(now * 1e-6 * (1.0 + 1e-15) + 1e-12)
        values = self.sched.counters()
        if values != self._last_counters:  # the counter track steps only where it changes
            self.rec.counter(S.SCHEDULER_COUNTER, now, values)
            self._last_counters = values
        factor = self.speed.factor_at(now)
        if batch is None:
            yield self._phase(S.SCHEDULE, self.costs.schedule_us(0, 0) * factor, NO_BATCH)
            return None
        if batch.num_prefill:  # a request's first admission ends its queue time
            self._scheduled_instants(batch, now)
        costs, requests = self.costs, batch.num_requests
        cost = costs.schedule_us(
            requests, batch.query_tokens, costs.kv_blocks(batch.kv_tokens, requests)
        )
        yield self._phase(S.SCHEDULE, cost * factor, batch_args(batch))
        return batch

    def _scheduled_instants(self, batch: Batch, now: float) -> None:
        """A "scheduled" instant for each request the batch admits for the first time."""
        first = batch.start_pos == 0
        if not first.any():
            return
        rows, rids = batch.idx[first], batch.rids[first]
        if int(rows.max()) >= self._admitted.size:  # requests added after the setup
            grown = np.zeros(self.sched.table.n, dtype=bool)
            grown[: self._admitted.size] = self._admitted
            self._admitted = grown
        new = ~self._admitted[rows]
        self._admitted[rows] = True
        for rid in rids[new].tolist():
            self.rec.request_event(S.SCHEDULED, now, rid, step=batch.step)

    def idle_until_arrival(self):
        """Nothing to run and nothing in flight: sleep until the next request arrives. The
        scheduler saw the queue when the empty schedule phase began; a request that arrived
        during that phase (it costs hardware.host.schedule's fixed_us) is there already: no
        sleep, the loop schedules again now."""
        now, nxt = self.env.now, self.sched.next_arrival_s() * 1e6
        if not nxt > self._asked_us:
            raise RuntimeError(
                f"t={now:.3f} us: the scheduler returned no batch with "
                "nothing in flight and no request still to arrive"
            )
        if nxt > now:
            self.n["idle_us"] += nxt - now
            yield self.env.timeout(nxt - now)

    def prepare(self, batch: Batch, slot: IOSlot, prev: Launched | None = None):
        """Build the inputs in the slot's pinned buffer: ids (real tokens where known,
        placeholders for ``prev``'s pending ones), positions, block tables, indices."""
        now, step, dev = self.env.now, batch.step, self.device
        self.slots.write(slot, slot.pinned_in, None, dev.host_vc, step, S.HOST, now)
        done = self.last_updated
        if (
            done is not None
            and not happens_before(done.compute, dev.host_vc)
            and batch.num_decode > int(np.count_nonzero(batch.placeholder))
        ):
            # tokens the host copies from the last update: is their forward known finished?
            self.slots.token_ready(
                done.compute, dev.host_vc, "prepare", step, S.HOST, now, slot, done.step
            )
        args = self._prepared = batch_args(batch, slot=slot.index)
        costs, requests = self.costs, batch.num_requests
        cost = costs.prepare_us(
            requests, batch.query_tokens, costs.kv_blocks(batch.kv_tokens, requests)
        )
        yield self._phase(S.PREPARE, cost * self.speed.factor_at(now), args)

    def launch(self, batch: Batch, slot: IOSlot, prev: Launched | None):
        """Enqueue H2D -> compute -> D2H, ordered by events (one graph launch, or every kernel
        eagerly); the host does not wait here."""
        now = self.env.now
        self.launches += 1
        args = self._prepared
        if args is None or args["step"] != batch.step or args["slot"] != slot.index:
            args = batch_args(batch, slot=slot.index)
        plan = plan_step(self, batch, prev)
        h2d, compute, d2h, d2h_done, fwd_us, t = enqueue_step(self, batch, slot, prev, plan)
        fwd_args = self._record_launch(plan, args, h2d, compute, d2h, fwd_us)
        launched = Launched(batch, slot, args, h2d, compute, d2h, d2h_done, fwd_args, batch.step)
        yield self._phase(S.LAUNCH, t - now, args)
        return launched

    def _record_launch(
        self, plan: StepPlan, args: dict[str, Any], h2d: Op, compute: Op, d2h: Op, fwd_us: float
    ) -> dict[str, Any]:
        """The step's three GPU spans and counts; returns the forward span's args."""
        fwd = plan.forward
        # the copies' byte counts are trace args only: the metric columns share the step's args
        traced = self.rec.tracing
        h2d_args = {**args, "bytes": plan.h2d_bytes} if traced else args
        self._gpu_span(h2d.lane, S.COPY_H2D, h2d.start, h2d.end - h2d.start, h2d_args)
        busy_start = compute.end - fwd_us  # eager: launch-bound idle shows before it
        fwd_args = {**args, "new_tokens": plan.samples}
        if compute.end - compute.start - fwd_us > 0.5:
            # how long the stream waited for the host's launches inside this forward: the
            # runtime's event-timed span holds it (cbsim.validation compares it that way)
            fwd_args["launch_bound_us"] = compute.end - compute.start - fwd_us
        if plan.carry and plan.graph:  # captured in the graph: part of the replay, an arg
            fwd_args["carry_over_us"] = fwd.carry_over_us
            self._gpu_span(compute.lane, compute.name, busy_start, fwd_us, fwd_args)
        else:
            if plan.carry:  # eagerly, its own kernel just before the forward's
                self._gpu_span(compute.lane, S.CARRY_OVER, busy_start, fwd.carry_over_us, args)
            self._gpu_span(
                compute.lane,
                compute.name,
                busy_start + fwd.carry_over_us,
                fwd_us - fwd.carry_over_us,
                fwd_args,
            )
        d2h_args = {**args, "bytes": plan.d2h_bytes} if traced else args
        self._gpu_span(d2h.lane, S.COPY_D2H, d2h.start, d2h.end - d2h.start, d2h_args)
        n = self.n
        n["steps"] += 1
        n["graph_steps" if plan.graph else "eager_steps"] += 1
        n["carry_over_steps"] += plan.carry
        n["kernels_launched"] += fwd.eager_kernels if plan.graph else fwd.kernels
        n["launch_wait_us"] += compute.end - compute.start - fwd_us
        return fwd_args

    def wait(self, launched: Launched):
        """Block until the batch's sampled tokens are on the host (its d2h_done event; on the
        legacy default stream, a device-wide sync)."""
        now, host = self.env.now, self.costs.host
        factor = self.speed.factor_at(now)
        event = self.device.sync_point(launched.d2h_done)
        blocked = event.time - now
        dur = blocked + factor * host.sync_wake_us if blocked > 0 else factor * host.event_us
        self.n["host_blocks"] += 1
        self.n["host_blocked_us"] += dur
        yield self._phase(S.WAIT, dur, launched.args)
        self.device.host_learns(event)

    def update(self, launched: Launched):
        """Read the tokens from the pinned outputs, hand them to the scheduler (which retires
        finished requests and frees their KV blocks)."""
        now, batch = self.env.now, launched.batch
        self.slots.host_reads_outputs(launched.slot, batch.step, S.HOST, now)
        tokens, kept = self.sampler.sample(batch)
        finished = self.sched.update(batch, tokens)
        self.n["generated_tokens"] += kept
        if kept != batch.num_samples:  # sampled after the request's EOS: computed, dropped
            self.rec.settle(launched.compute.lane, launched.forward_args, kept)
            self.n["dropped_tokens"] += batch.num_samples - kept
        for rid in self.sched.last_first_token_rids:
            self.rec.request_event(S.FIRST_TOKEN, now, rid, step=batch.step)
        for rid in finished:
            self.rec.request_event(
                S.FINISH,
                now,
                rid,
                tokens=self.sched.num_outputs(rid),
                reason=self.sched.finish_reason(rid),
                step=batch.step,
            )
            self.n["requests_finished"] += 1
        self.last_updated = launched
        costs, requests = self.costs, batch.num_requests
        factor = self.speed.factor_at(now)
        dur = costs.update_us(
            requests, batch.num_samples, costs.kv_blocks(batch.kv_tokens, requests)
        )
        dur *= factor
        stall = self.costs.stall_us(self.n["updates"]) * factor
        self.n["updates"] += 1
        args = launched.args
        if stall:
            self.n["host_stalls"] += 1
            self.n["host_stall_us"] += stall
            args = {**args, "stall_us": stall}
        yield self._phase(S.UPDATE, dur + stall, args)
