"""Launching one step: H2D -> compute -> D2H enqueued on the streams, ordered by events.

``plan_step`` decides what the step runs (a graph replay or every kernel eagerly, the carry-over,
the forward's cost, the bytes copied); ``enqueue_step`` puts its three operations on the streams
at the host times the launch phase reaches, and checks every IO-slot buffer access on the way.
Both only compute: the host phase that calls them (host_phases.py) writes the spans.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cbsim.config.hardware import HostCosts
from cbsim.costs import ForwardCost
from cbsim.costs.attention_groups import extra_table_entries
from cbsim.costs.clock import lagged
from cbsim.costs.eager_tokens import eager_tokens
from cbsim.scheduler import Batch
from cbsim.sim.host_state import HostState, Launched
from cbsim.sim.io_slots import IOSlot
from cbsim.sim.streams import CudaEvent, Op
from cbsim.trace import schema as S


@dataclass(slots=True)
class StepPlan:
    """What one step runs and moves."""

    graph: bool  # a graph replay (one, or piecewise: fwd.pieces) else every kernel eagerly
    bucket: int | None  # the captured batch size (tokens, piecewise) a graph step is padded to
    width: int | None  # the graph's block table (tokens): its launch class
    carry: bool  # batch N's tokens scattered into this batch's inputs first
    forward: ForwardCost
    samples: int  # sampled positions (tokens the forward produces)
    kv_blocks: int  # block-table entries (costs.kv_blocks)
    h2d_bytes: int
    d2h_bytes: int


@dataclass(slots=True, frozen=True)
class LaunchHost:
    """A launch's host costs (microseconds) at the host's speed factor when it starts, but an
    eager launch's own (per kernel, per forward) at the profile's eager level, times the host's
    reading to a power of its own (``hardware.host.level.eager_exponent``): its level is not
    the Python phases' (the H100 profile's machine: fresh processes ran the phases at x0.59 of
    the probes' fit and the eager launches at x1.21-1.45; processes of other machines reading
    a host twice as slow at start launched eagerly 1.2-1.9x as long). The host's fast and slow
    stays (a band's draw) move it as they move every host cost: times the factor in force over
    the run's mean factor, 1 in a plain run. The steady stretch (stretch_loop.py) charges the
    very same products."""

    per_block: float  # launch_per_block_us: staging one block-table entry
    copy: float  # copy_launch_us
    event: float  # event_us: record one event or make a stream wait on one
    graph: float  # graph_launch_us
    kernel: float  # kernel_launch_us
    forward: float  # eager_forward_us: an eager forward's own Python beside its kernels

    @classmethod
    def at(cls, hc: HostCosts, factor: float, stay: float = 1.0) -> LaunchHost:
        """``stay``: the factor in force over the run's mean one (the eager launch's share)."""
        eager = stay * hc.level.eager_factor
        return cls(
            factor * hc.launch_per_block_us,
            factor * hc.copy_launch_us,
            factor * hc.event_us,
            factor * hc.graph_launch_us,
            eager * hc.kernel_launch_us,
            eager * hc.eager_forward_us,
        )

    def eager_kernel(self, kernels: int) -> float:
        """Host time per kernel of an eager forward: its own Python runs between its kernels
        (the GPU works meanwhile), so it is spread over them."""
        return self.kernel + self.forward / max(kernels, 1)


def launch_host(host: HostState, factor: float) -> LaunchHost:
    """``LaunchHost.at`` the host's costs and ``factor``, made once per factor a run charges (a
    plain run's one, a band's draw's two levels)."""
    got = host.launch_hosts.get(factor)
    if got is None:
        stay = factor / host.speed.factor
        got = host.launch_hosts[factor] = LaunchHost.at(host.costs.host, factor, stay)
    return got


def plan_step(host: HostState, batch: Batch, prev: Launched | None) -> StepPlan:
    """Graph or eager, carry-over or not, and the forward's cost."""
    costs, eng = host.costs, host.engine
    carry = bool(
        eng.carry_over
        and prev is not None
        and batch.num_decode > 0
        and np.count_nonzero(batch.placeholder) > 0
    )
    # one query token per request (decode rows, or a prompt's last token among them): the
    # runtime replays a graph for it (runtime/runner.py plan); a step with prompt tokens: the
    # graphs of its token bucket, engine.mixed_graphs (costs/mixed_graphs.py; none: eager)
    one_each = batch.query_tokens == batch.num_requests
    padded, tokens_bucket = costs.graph_padding(batch)
    graph = eng.cuda_graphs and (padded is not None or tokens_bucket is not None)
    fwd = costs.forward(
        batch,
        graph=graph,
        carry_over=carry,
        padded_requests=padded if graph else None,
        padded_tokens=tokens_bucket if graph else None,
    )
    # block-table entries: sum of ceil(context / block) is at most this (one partial each)
    kv_blocks = costs.kv_blocks(batch.kv_tokens, batch.num_requests)
    tokens = batch.query_tokens if graph else eager_tokens(batch, eng.eager_token_multiple)
    entries = kv_blocks
    if not one_each:  # short continuations' decode rows each carry their request's table
        entries += extra_table_entries(costs.groups(batch), batch.context_lens, costs.block_size)
    h2d_bytes = costs.h2d_bytes(tokens, batch.num_requests, batch.num_samples, entries)
    samples = batch.num_samples
    bucket = (padded or tokens_bucket) if graph else None
    width = costs.graph_table(padded, int(batch.context_lens.max())) if padded and graph else None
    return StepPlan(
        graph, bucket, width, carry, fwd, samples, kv_blocks, h2d_bytes, costs.d2h_bytes(samples)
    )


def enqueue_step(
    host: HostState, batch: Batch, slot: IOSlot, prev: Launched | None, plan: StepPlan
) -> tuple[Op, Op, Op, CudaEvent, float, float]:
    """Enqueue the step's three operations from host time ``host.env.now``; returns them, the
    D2H event, the forward's duration on the stream and the host time the launch ends. Every
    host cost is charged at the host's speed when the launch starts."""
    costs, dev, tracker = host.costs, host.device, host.slots
    waits, step, vc, graph = host.engine.event_waits, batch.step, dev.host_vc, plan.graph
    hs = launch_host(host, host.speed.factor_at(host.env.now))
    fwd = plan.forward
    fwd_us = fwd.total_us
    # stage the block tables, then H2D: pinned inputs -> device inputs, record h2d_done
    t = host.env.now + hs.per_block * plan.kv_blocks + hs.copy
    h2d = dev.h2d.enqueue(S.COPY_H2D, t, costs.h2d_us(plan.h2d_bytes), vc)
    tracker.read(slot, slot.pinned_in, h2d, h2d.vc, step, h2d.lane, h2d.start)
    tracker.write(slot, slot.dev_in, h2d, h2d.vc, step, h2d.lane, h2d.start)
    t += hs.event
    h2d_done = dev.h2d.record()
    # compute: wait on h2d_done, carry-over scatter, forward; record compute_done
    t += hs.event
    # a graph's launch (its first in this run costs more), or the first kernel's; then a
    # piecewise replay's other pieces and the attention kernels between them (none for one graph)
    per_kernel = hs.eager_kernel(fwd.kernels)
    launch_first = hs.graph + first_replay_us(host, slot, plan) if graph else per_kernel
    rest = (fwd.pieces - 1) * hs.graph + fwd.eager_kernels * hs.kernel if graph else 0.0
    entries = fwd.pieces + fwd.eager_kernels if graph else fwd.kernels
    if costs.idle_slowdown and dev.compute.seq:
        # a compute stream that sat idle runs this forward slower
        tail = dev.compute.tail
        begin = max(t + launch_first, tail + dev.compute.gap)
        if waits and h2d_done.time > begin:
            begin = h2d_done.time
        slow = costs.idle_slowdown_us(begin - tail)
        if slow:
            fwd_us += slow
            fwd.overhead_us += slow
    if costs.gpu.clock.throttles:
        fwd_us += clock_lag_us(host, batch, fwd, t + launch_first)
    ready = (h2d_done,) if waits else ()
    if graph:
        t += launch_first
        # the GPU cannot finish before the host has launched the last piece (one graph: no bound)
        last = t + rest + fwd_us / entries
        compute = dev.compute.enqueue(S.GRAPH_REPLAY, t, fwd_us, vc, ready, not_before_end=last)
        t += rest
    else:
        first = t + per_kernel
        t += per_kernel * fwd.kernels
        # the GPU cannot finish before the host has launched the last kernel
        compute = dev.compute.enqueue(
            S.FORWARD, first, fwd_us, vc, ready, not_before_end=t + fwd_us / fwd.kernels
        )
    # a full launch queue holds the host until the GPU has worked its way down it
    t = max(t, host.launch_queue.push(compute.start, compute.end, entries))
    tracker.read(slot, slot.dev_in, compute, compute.vc, step, compute.lane, compute.start)
    if plan.carry:
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
    t += hs.event
    d2h, t = _enqueue_d2h(host, slot, step, plan, dev.compute.record(), t, hs)
    return h2d, compute, d2h, dev.d2h.record(), fwd_us, t


def clock_lag_us(host: HostState, batch: Batch, fwd: ForwardCost, begin: float) -> float:
    """How much longer (or shorter) this forward runs than at its settled clock: a step with
    prompt tokens starts from the clock the forward before it left, recovered over the idle
    before ``begin`` (costs/clock.py ``lagged``); a decode step runs at its settled clock. Leaves
    the clock where the forward ends."""
    dev = host.device
    if batch.kind == "decode" or fwd.clocked_us <= 0.0:
        dev.clock_ratio = fwd.clock_ratio
        return 0.0
    at_boost = fwd.total_us - fwd.throttle_us
    extra, dev.clock_ratio = lagged(
        host.costs.gpu.clock,
        fwd.clock_ratio,
        fwd.clocked_us,
        at_boost,
        dev.clock_ratio,
        begin - dev.compute.tail,
    )
    change, fwd.throttle_us = extra - fwd.throttle_us, extra
    return change


def first_replay_us(host: HostState, slot: IOSlot, plan: StepPlan) -> float:
    """The extra host time of this (slot, bucket, width) graph's first launch, once per run,
    none with engine.upload_graphs (the capture launched it). A piecewise replay's: its pieces'
    nodes; its width None keys it apart from the decode graphs, whose tables always have one."""
    fwd = plan.forward
    key = (slot.index, plan.bucket, plan.width)
    if key in host.replayed:
        return 0.0
    host.replayed.add(key)  # fast_forward.graph_room reads which graphs were launched
    if host.costs.upload_graphs:
        return 0.0
    return host.costs.host.graph_first_replay_us_per_kernel * (fwd.kernels - fwd.eager_kernels)


def _enqueue_d2h(
    host: HostState,
    slot: IOSlot,
    step: int,
    plan: StepPlan,
    compute_done: CudaEvent,
    t: float,
    hs: LaunchHost,
) -> tuple[Op, float]:
    """D2H: wait on compute_done, copy the sampled tokens (d2h_done is recorded after it)."""
    dev, tracker = host.device, host.slots
    t += hs.event + hs.copy
    ready = (compute_done,) if host.engine.event_waits else ()
    d2h = dev.d2h.enqueue(S.COPY_D2H, t, host.costs.d2h_us(plan.d2h_bytes), dev.host_vc, ready)
    tracker.read(slot, slot.dev_out, d2h, d2h.vc, step, d2h.lane, d2h.start)
    tracker.write(slot, slot.pinned_out, d2h, d2h.vc, step, d2h.lane, d2h.start)
    return d2h, t + hs.event
