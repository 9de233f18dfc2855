"""The simulated engine: the host phases the loops in host.py are written in.

Each phase is a generator the host process ``yield from``s: it costs host time (costs.py), writes
its span, and touches the streams and IO slots. Time is in microseconds; the shared scheduler sees
seconds. The scheduler is cbsim.scheduler, the very one the runtime drives.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from cbsim.config.errors import ConfigError
from cbsim.config.schema import CbsimConfig, EngineConfig
from cbsim.costs import CostModel, ForwardCost
from cbsim.scheduler import Batch, Scheduler, default_num_kv_blocks
from cbsim.sim.record import Recorder
from cbsim.sim.slots import IOSlot, SlotTracker
from cbsim.sim.streams import CudaEvent, Device, LaunchQueue, Op, happens_before
from cbsim.sim.tokens import Sampler
from cbsim.trace import TraceBuilder
from cbsim.trace import schema as S
from cbsim.workload import check_requests_fit, make_requests

NO_BATCH = {"step": -1, "slot": -1, "requests": 0, "query_tokens": 0, "kv_tokens": 0, "kind": ""}


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
    forward: ForwardCost
    forward_args: dict[str, Any]  # the forward span's args: new_tokens is settled in update


class HazardLog(Counter):
    """Hazards by kind, each also written to the trace (kept off SimEngine: no reference cycle
    holds the trace alive after the run)."""

    def __init__(self, trace: TraceBuilder) -> None:
        super().__init__()
        self.trace = trace

    def __call__(self, kind: str, lane: str, ts: float, step: int, slot: int, detail: str) -> None:
        self.trace.hazard(lane, ts, kind, step, slot, detail)
        self[kind] += 1


class SimEngine:
    """One simulated run: scheduler, cost model, device (streams), IO slots, trace, counters."""

    def __init__(self, config: CbsimConfig, engine: EngineConfig, trace: TraceBuilder) -> None:
        self.config, self.engine, self.trace = config, engine, trace
        self.env = simpy.Environment()
        w = config.workload
        self.requests = make_requests(w, config.model.vocab_size)
        self.costs = CostModel(
            config,
            max_context=max((r.prompt_len + r.max_new_tokens for r in self.requests), default=1),
        )
        max_context = config.model.max_position_embeddings
        self.sampler = Sampler(self.requests, w.ignore_eos, config.model.vocab_size, w.batch_size)
        cache = None if w.kv_num_blocks is None else w.kv_num_blocks * w.kv_block_size
        requests = self.sampler.scheduler_requests(self.requests, max_context, cache)
        kv_blocks = default_num_kv_blocks(w, requests)
        try:
            check_requests_fit(
                requests,
                max_context,
                kv_blocks * w.kv_block_size,
                None if w.chunked_prefill else w.max_batch_tokens,
            )
        except ValueError as exc:  # a drawn request that can never run: the config's fault
            raise ConfigError(str(exc)) from None
        self.sched = Scheduler(w, kv_blocks, eos_token_id=self.sampler.eos_id)
        self.sched.add_all(requests)
        self.device = Device(engine.streams)
        self.launch_queue = LaunchQueue(config.hardware.gpu.launch_queue_depth)
        self.rec = Recorder(trace, (S.HOST, *(st.lane for st in self.device.streams)))
        self._last_counters: dict[str, int] = {}
        self._prepared: dict[str, Any] | None = None  # span args of the batch last prepared
        self.hazards = HazardLog(trace)
        self.slots = SlotTracker(engine.io_slots, self.hazards)
        self.launches = 0
        self.last_updated: Launched | None = None
        self.host_us: Counter[str] = Counter()
        self.lane_busy_us: Counter[str] = Counter()
        self.n = Counter()  # steps, tokens, blocks, graph/eager steps, ...
        for r in self.requests:
            trace.request_event(
                S.ARRIVAL,
                r.arrival_s * 1e6,
                r.rid,
                prompt_len=r.prompt_len,
                max_new_tokens=r.max_new_tokens,
            )

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

    def next_slot(self) -> IOSlot:
        return self.slots.slot_for(self.launches)

    @staticmethod
    def _batch_args(batch: Batch, slot: int) -> dict[str, Any]:
        """The standard span args of a batch (one dict per step, shared by its spans)."""
        return {
            "step": batch.step,
            "slot": slot,
            "requests": batch.num_requests,
            "query_tokens": batch.query_tokens,
            "kv_tokens": batch.kv_tokens,
            "kind": batch.kind,
        }

    # ---- host phases -----------------------------------------------------------------------
    def schedule(self):
        """Ask the shared scheduler for the next batch (None: nothing can run now)."""
        now = self.env.now
        # us -> s round-off: a few ulps relative (arrival_s * 1e6 * 1e-6 can fall below
        # arrival_s by more than any fixed slack once arrivals pass ~1e4 s) plus 1 ps near 0
        batch = self.sched.schedule(now * 1e-6 * (1.0 + 1e-15) + 1e-12)
        values = self.sched.counters()
        if values != self._last_counters:  # the counter track steps only where it changes
            self.rec.counter(S.SCHEDULER_COUNTER, now, values)
            self._last_counters = values
        if batch is None:
            yield self._phase(S.SCHEDULE, self.costs.schedule_us(0, 0), NO_BATCH)
            return None
        costs, requests = self.costs, batch.num_requests
        cost = costs.schedule_us(
            requests, batch.query_tokens, costs.kv_blocks(batch.kv_tokens, requests)
        )
        yield self._phase(S.SCHEDULE, cost, self._batch_args(batch, -1))
        return batch

    def idle_until_arrival(self):
        """Nothing to run and nothing in flight: sleep until the next request arrives."""
        nxt = self.sched.next_arrival_s() * 1e6
        if not nxt > self.env.now:
            raise RuntimeError(
                f"t={self.env.now:.3f} us: the scheduler returned no batch with "
                "nothing in flight and no request still to arrive"
            )
        self.n["idle_us"] += nxt - self.env.now
        yield self.env.timeout(nxt - self.env.now)

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
                done.compute, dev.host_vc, "prepare", step, S.HOST, now, slot, done.batch.step
            )
        args = self._prepared = self._batch_args(batch, slot.index)
        costs, requests = self.costs, batch.num_requests
        cost = costs.prepare_us(
            requests, batch.query_tokens, costs.kv_blocks(batch.kv_tokens, requests)
        )
        yield self._phase(S.PREPARE, cost, args)

    def launch(self, batch: Batch, slot: IOSlot, prev: Launched | None):
        """Enqueue H2D -> compute -> D2H, ordered by events (one graph launch, or every kernel
        eagerly); the host does not wait here."""
        costs, host, eng, dev, tracker = (
            self.costs,
            self.costs.host,
            self.engine,
            self.device,
            self.slots,
        )
        now, step, vc = self.env.now, batch.step, dev.host_vc
        self.launches += 1
        args = self._prepared
        if args is None or args["step"] != step or args["slot"] != slot.index:
            args = self._batch_args(batch, slot.index)
        carry = bool(
            eng.carry_over
            and prev is not None
            and batch.num_decode > 0
            and np.count_nonzero(batch.placeholder) > 0
        )
        # one query token per request (decode rows, or a prompt's last token among them): the
        # runtime replays a graph for it (runtime/runner.py plan)
        one_each = batch.query_tokens == batch.num_requests
        padded = costs.graph_size(batch.num_requests) if one_each else None
        graph = eng.cuda_graphs and padded is not None
        fwd = costs.forward(
            batch, graph=graph, carry_over=carry, padded_requests=padded if graph else None
        )
        fwd_us = fwd.total_us
        samples = batch.num_samples
        # block-table entries: sum of ceil(context / block) is at most this (one partial each)
        requests = batch.num_requests
        kv_blocks = costs.kv_blocks(batch.kv_tokens, requests)
        h2d_bytes = costs.h2d_bytes(batch.query_tokens, requests, samples, kv_blocks)
        waits = eng.event_waits
        # stage the block tables, then H2D: pinned inputs -> device inputs, record h2d_done
        t = now + host.launch_per_block_us * kv_blocks + host.copy_launch_us
        h2d = dev.h2d.enqueue(S.COPY_H2D, t, costs.h2d_us(h2d_bytes), vc)
        tracker.read(slot, slot.pinned_in, h2d, h2d.vc, step, h2d.lane, h2d.start)
        tracker.write(slot, slot.dev_in, h2d, h2d.vc, step, h2d.lane, h2d.start)
        t += host.event_us
        h2d_done = dev.h2d.record()
        # compute: wait on h2d_done, carry-over scatter, forward; record compute_done
        t += host.event_us
        if costs.idle_slowdown and dev.compute.seq:
            # a compute stream that sat idle runs this forward slower
            tail = dev.compute.tail
            begin = max(t + (host.graph_launch_us if graph else host.kernel_launch_us), tail)
            if waits and h2d_done.time > begin:
                begin = h2d_done.time
            slow = costs.idle_slowdown_us(begin - tail)
            if slow:
                fwd_us += slow
                fwd.overhead_us += slow
        if graph:
            t += host.graph_launch_us
            compute = dev.compute.enqueue(
                S.GRAPH_REPLAY, t, fwd_us, vc, (h2d_done,) if waits else ()
            )
        else:
            first = t + host.kernel_launch_us
            t += host.kernel_launch_us * fwd.kernels
            # the GPU cannot finish before the host has launched the last kernel
            compute = dev.compute.enqueue(
                S.FORWARD,
                first,
                fwd_us,
                vc,
                (h2d_done,) if waits else (),
                not_before_end=t + fwd_us / fwd.kernels,
            )
        # a full launch queue holds the host until the GPU has worked its way down it
        t = max(t, self.launch_queue.push(compute.start, compute.end, 1 if graph else fwd.kernels))
        tracker.read(slot, slot.dev_in, compute, compute.vc, step, compute.lane, compute.start)
        if carry:
            tracker.read(
                prev.slot,
                prev.slot.dev_out,
                compute,
                compute.vc,
                step,
                compute.lane,
                compute.start,
                kind="carry_over_before_ready",
            )
        tracker.write(slot, slot.dev_out, compute, compute.vc, step, compute.lane, compute.start)
        t += host.event_us
        compute_done = dev.compute.record()
        # D2H: wait on compute_done, copy the sampled tokens, record d2h_done
        t += host.event_us + host.copy_launch_us
        d2h_bytes = costs.d2h_bytes(samples)
        d2h = dev.d2h.enqueue(
            S.COPY_D2H, t, costs.d2h_us(d2h_bytes), vc, (compute_done,) if waits else ()
        )
        tracker.read(slot, slot.dev_out, d2h, d2h.vc, step, d2h.lane, d2h.start)
        tracker.write(slot, slot.pinned_out, d2h, d2h.vc, step, d2h.lane, d2h.start)
        t += host.event_us
        d2h_done = dev.d2h.record()

        self._gpu_span(
            h2d.lane, S.COPY_H2D, h2d.start, h2d.end - h2d.start, {**args, "bytes": h2d_bytes}
        )
        busy_start = compute.end - fwd_us  # eager: launch-bound idle shows before it
        fwd_args = {**args, "new_tokens": samples}
        if compute.end - compute.start - fwd_us > 0.5:
            # how long the stream waited for the host's launches inside this forward: the
            # runtime's event-timed span holds it (cbsim.validation compares it that way)
            fwd_args["launch_bound_us"] = compute.end - compute.start - fwd_us
        if carry and graph:  # captured in the graph: part of the replay, shown as an arg
            fwd_args["carry_over_us"] = fwd.carry_over_us
            self._gpu_span(compute.lane, compute.name, busy_start, fwd_us, fwd_args)
        else:
            if carry:  # eagerly, its own kernel just before the forward's
                self._gpu_span(compute.lane, S.CARRY_OVER, busy_start, fwd.carry_over_us, args)
            self._gpu_span(
                compute.lane,
                compute.name,
                busy_start + fwd.carry_over_us,
                fwd_us - fwd.carry_over_us,
                fwd_args,
            )
        self._gpu_span(
            d2h.lane, S.COPY_D2H, d2h.start, d2h.end - d2h.start, {**args, "bytes": d2h_bytes}
        )
        n = self.n
        n["steps"] += 1
        n["graph_steps" if graph else "eager_steps"] += 1
        n["carry_over_steps"] += carry
        n["kernels_launched"] += 0 if graph else fwd.kernels
        n["launch_wait_us"] += compute.end - compute.start - fwd_us
        launched = Launched(batch, slot, args, h2d, compute, d2h, d2h_done, fwd, fwd_args)
        yield self._phase(S.LAUNCH, t - now, args)
        return launched

    def wait(self, launched: Launched):
        """Block until the batch's sampled tokens are on the host (its d2h_done event; on the
        legacy default stream, a device-wide sync)."""
        now, host = self.env.now, self.costs.host
        event = self.device.sync_point(launched.d2h_done)
        blocked = event.time - now
        dur = blocked + host.sync_wake_us if blocked > 0 else host.event_us
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
            launched.forward_args["new_tokens"] = kept
            self.n["dropped_tokens"] += batch.num_samples - kept
        for rid in self.sched.last_first_token_rids:
            self.trace.request_event(S.FIRST_TOKEN, now, rid, step=batch.step)
        for rid in finished:
            state = self.sched.request(rid)
            self.trace.request_event(
                S.FINISH,
                now,
                rid,
                tokens=state.num_outputs,
                reason=state.finish_reason,
                step=batch.step,
            )
            self.n["requests_finished"] += 1
        self.last_updated = launched
        costs, requests = self.costs, batch.num_requests
        dur = costs.update_us(
            requests, batch.num_samples, costs.kv_blocks(batch.kv_tokens, requests)
        )
        stall = self.costs.stall_us(self.n["updates"])
        self.n["updates"] += 1
        args = launched.args
        if stall:
            self.n["host_stalls"] += 1
            self.n["host_stall_us"] += stall
            args = {**args, "stall_us": stall}
        yield self._phase(S.UPDATE, dur + stall, args)
