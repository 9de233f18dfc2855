"""Exact steady-state fast-forward: many identical decode steps at once.

In steady decode (the same requests, one token each, contexts growing by one) nothing can change
for a while when no arrival could be admitted, nobody samples EOS or a last output, the KV cache
has the blocks, and the engine is a clean one (three streams, event waits, an IO slot per batch
in flight; graph replays or eager launches, a band's host jitter and forward scale alike), and
the host's speed (host_speed.py) stays at one level: a stretch keeps only the steps whose host
phases all start before the level switches. Every step then runs the same host phases and stream
operations with costs that depend only on the step. ``plan`` says how many such steps lie ahead; ``costs_of`` computes their costs at once
(numpy, elementwise: the same float operations the step-by-step path does, checked against it at
both ends); stretch_loop.py runs the host's timing recurrence over them with the very operations
and order of host_phases.py and launch.py; stretch_record.py and stretch_state.py record the
steps and leave scheduler, streams, IO slots and counters as stepping would have.
"""

from __future__ import annotations

import copy
import math
from bisect import bisect_left

import numpy as np

from cbsim.costs.clock import settle
from cbsim.sim.host_state import HostState, Launched
from cbsim.sim.stretch import StretchCosts
from cbsim.sim.stretch_loop import run_stretch
from cbsim.sim.stretch_record import count, record
from cbsim.sim.stretch_state import hand_over

MIN_STEPS = 8  # fewer are stepped: the set-up would cost more than it saves
MAX_STEPS = 4096  # per stretch (the costs are computed for this many steps at most)
# per stretch while an arrival may end it early: the costs of steps it cuts off are wasted
MAX_STEPS_BEFORE_ARRIVAL = 128


class DecodeProbe:
    """The fields CostModel.forward reads of a steady decode batch."""

    kind = "decode"

    def __init__(self, ctx: np.ndarray) -> None:
        n = int(ctx.size)
        self.num_requests = self.query_tokens = self.num_samples = n
        self.context_lens = ctx
        self.start_pos = ctx - 1
        self.query_lens = np.ones(n, dtype=np.int64)
        self.kv_tokens = int(ctx.sum())

    def __len__(self) -> int:
        return self.num_requests


def clean_engine(host: HostState) -> bool:
    """The engine settings under which a steady step's work is the same every step."""
    eng, costs = host.engine, host.costs
    slots = 2 if eng.name == "async" else 1
    return (
        eng.streams == "three"
        and eng.event_waits
        and len(host.slots.slots) == slots
        and getattr(costs, "kernel_costs", None) is None
        and host.device.compute.seq > 0
    )


def plan(host: HostState, inflight: Launched | None) -> tuple[int, float]:
    """(steps to fast-forward, the arrival that ends the stretch; inf: none) or (0, inf)."""
    sched = host.sched
    if not host.fast_forward_on or not sched.decode.active or host.last_updated is None:
        return 0, float("inf")
    run = sched.run
    if not clean_engine(host):
        return 0, float("inf")
    if host.engine.name == "async":
        b = None if inflight is None else inflight.batch
        if (
            b is None
            or b.kind != "decode"
            or b.finishing.size
            or b.step != sched.step - 1
            or sched.updates.next_step != b.step
            or not np.array_equal(b.idx, run)
        ):
            return 0, float("inf")
    elif inflight is not None or sched.updates.next_step != sched.step:
        return 0, float("inf")
    room = graph_room(host, int(run.size), int(sched.decode.ctx.max()))
    if room < MIN_STEPS:
        return 0, float("inf")
    now_s = host.env.now * 1e-6 * (1.0 + 1e-15) + 1e-12
    k, admit_at = sched.decode.stretch(MAX_STEPS, now_s)
    k = min(k, room)
    k = min(k, host.sampler.eos_room(sched.table.rid[run]))
    if admit_at < float("inf"):
        k = min(k, MAX_STEPS_BEFORE_ARRIVAL)
    if host.engine.name == "async":
        k -= k % 2  # an even count keeps each IO slot's batches where stepping puts them
    return (k, admit_at) if k >= MIN_STEPS else (0, float("inf"))


def graph_room(host: HostState, requests: int, longest: int) -> int:
    """Steps ahead that replay one graph already launched by every IO slot (a graph's first
    launch costs more: launch.first_replay_us): 0 until then, else until the longest request
    (``longest`` tokens before the next step) outgrows the graph's table; eager steps: any."""
    costs = host.costs
    bucket = costs.graph_size(requests) if host.engine.cuda_graphs else None
    if bucket is None:
        return MAX_STEPS
    table = costs.graph_table(bucket, longest + 1)
    if not all((slot.index, bucket, table) in host.replayed for slot in host.slots.slots):
        return 0
    return table - longest


def costs_of(host: HostState, k: int, carry: bool, kv_first_update: int) -> StretchCosts | None:
    """The costs of the next ``k`` steady steps (None: the vectorised forward does not match
    CostModel.forward, so step instead)."""
    costs, sched, hc = host.costs, host.sched, host.costs.host
    dec = sched.decode
    n = int(sched.run.size)
    j = np.arange(1, k + 1, dtype=np.int64)
    kv = dec.kv + n * j
    blocks = costs.kv_blocks(kv, n)
    graph = bool(host.engine.cuda_graphs and costs.graph_size(n) is not None)
    forward = _forward_us(host, dec.ctx, k, carry, graph)
    if forward is None:
        return None
    fwd_total, last, clock_ratio = forward
    kv_upd = kv if host.engine.name == "sync" else np.concatenate(([kv_first_update], kv[:-1]))
    phases = _host_costs(costs, n, blocks, costs.kv_blocks(kv_upd, n), k)
    if phases is None:
        return None
    h2d_bytes = costs.h2d_bytes(n, n, n, blocks)
    f = host.speed.factor_at(host.env.now)  # the level the stretch stays in (fast_forward)
    return StretchCosts(
        kv_tokens=kv.tolist(),
        schedule=_phase(phases[0] * f, k),
        prepare=_phase(phases[1] * f, k),
        update=_phase(phases[2] * f, k),
        h2d=costs.h2d_us(h2d_bytes).tolist(),
        h2d_bytes=h2d_bytes.tolist(),
        stage=((f * hc.launch_per_block_us) * blocks).tolist(),
        forward=fwd_total,
        opened=dec._opened(k),
        last_forward=last,
        graph=graph,
        kernels=last.kernels,
        carry_us=last.carry_over_us,
        factor=f,
        clock_ratio=clock_ratio,
    )


def _host_costs(costs, n: int, blocks: np.ndarray, upd_blocks: np.ndarray, k: int):
    """Each step's schedule, prepare and update cost. With a band's host jitter each schedule
    draws the factor its prepare and update reuse: drawn here from a copy of the jitter (the
    caller consumes the real one for the steps the stretch keeps: ``consume_jitter``), and step
    0 checked against CostModel's own calls on another copy (None: they differ)."""
    jitter = getattr(costs, "jitter", None)
    if jitter is None:
        return (
            costs.schedule_us(n, n, blocks),
            costs.prepare_us(n, n, blocks),
            costs.update_us(n, n, upd_blocks),
        )
    peek = copy.deepcopy(jitter)
    factor = np.array([peek.step() for _ in range(k)])
    host = costs.host
    out = (
        host.schedule.cost(n, n, blocks) * factor,
        host.prepare.cost(n, n, blocks) * factor,
        host.update.cost(n, n, upd_blocks) * factor,
    )
    costs.jitter = copy.deepcopy(jitter)
    try:
        first = (
            costs.schedule_us(n, n, int(blocks[0])),
            costs.prepare_us(n, n, int(blocks[0])),
            costs.update_us(n, n, int(upd_blocks[0])),
        )
    finally:
        costs.jitter = jitter
    return out if all(a == b[0] for a, b in zip(first, out)) else None


def consume_jitter(host: HostState, steps: int) -> None:
    """The host jitter's draws of the schedules a kept stretch made."""
    jitter = getattr(host.costs, "jitter", None)
    if jitter is not None:
        for _ in range(steps):
            jitter.step()


def _phase(values, k: int) -> list[float]:
    """A host phase's cost per step (a scalar when no term depends on the step)."""
    arr = np.asarray(values, dtype=np.float64)
    return arr.tolist() if arr.ndim else [float(arr)] * k


def _forward_us(host: HostState, ctx0: np.ndarray, k: int, carry: bool, graph: bool):
    """Each step's forward on the stream: the steps' only varying term, attention over the
    growing contexts, vectorised; the rest as CostModel.forward gives it for the first step.
    Both ends are checked against CostModel.forward itself."""
    costs, gpu = host.costs, host.costs.gpu
    n = int(ctx0.size)
    padded = costs.graph_size(n) if graph else None
    ctx = ctx0[None, :] + np.arange(1, k + 1, dtype=np.int64)[:, None]  # [step, request]

    def model(c: np.ndarray):
        return costs.forward(DecodeProbe(c), graph=graph, carry_over=carry, padded_requests=padded)

    first = model(ctx[0])
    kv = ctx.sum(axis=1)
    pad = gpu.attention_kv_pad
    read = (((ctx + pad - 1) // pad) * pad).sum(axis=1) if pad > 1 else kv
    attention = np.maximum(
        costs.attn_flops_coeff * kv.astype(np.float64) / costs.attn_flops,
        (read + n) * costs.kv_bytes_per_token / costs.attn_bw,
    )
    if costs.walk_us:
        rows = padded if padded is not None else n
        width = costs.graph_table(rows, int(ctx[0].max())) if padded is not None else None
        part = costs.partition(rows, width)
        attention = attention + costs.walk_us * np.minimum(ctx.max(axis=1), part)
    scale = gpu.spread.forward_scale
    if scale != 1.0:  # a band's draw of the forward model's error, as CostModel.forward does
        attention = attention * scale
    total = first.linear_us + first.lm_head_us + attention + first.overhead_us
    total = total + first.carry_over_us
    ratio = np.ones(k)
    if first.clocked_us > 0.0:  # the settled clock, as CostModel.forward charges it
        rows = padded if padded is not None else n
        flops = costs.forward_gemm_flops(rows, rows)
        ratio, extra = settle(gpu.clock, flops, first.clocked_us, total, costs.peak_per_us)
        total = total + extra
    last = model(ctx[-1])
    if total[0] != first.total_us or total[-1] != last.total_us:
        return None
    return total.tolist(), last, ratio.tolist()


def before_switch(host: HostState, k: int, switch_at: float, is_async: bool) -> int:
    """At most the steps that can start before the host's level switches (so a stretch does not
    cost thousands of steps it drops): each step takes at least a forward on the compute stream,
    and forwards only grow in steady decode (the contexts do), the host running a step or two
    ahead. Fewer kept than this is only slower, never different."""
    if k == 0 or switch_at == math.inf:
        return k
    last = host.last_updated.compute
    fwd = last.end - last.start
    if fwd > 0:
        k = min(k, int((switch_at - host.env.now) / fwd) + 4)
    return k - k % 2 if is_async else k


def fast_forward(host: HostState, inflight: Launched | None):
    """A SimPy phase: fast-forward the steady steps ahead, if any (one timeout for all of
    them); returns the batch in flight after them (async) or ``inflight`` unchanged."""
    k, admit_at = plan(host, inflight)
    is_async = inflight is not None
    switch_at = host.speed.next_switch(host.env.now)
    k = before_switch(host, k, switch_at, is_async)
    if k < MIN_STEPS:
        return inflight
    c = costs_of(host, k, is_async, inflight.batch.kv_tokens if is_async else 0)
    if c is None:
        host.fast_forward_on = False  # the cost model has a term this path does not know
        return inflight
    first_wait = inflight.d2h_done.time if is_async else None
    queued = list(host.launch_queue.ops)  # run_stretch pushes every step it runs
    tl = run_stretch(host, k, c, first_wait, admit_at, host.n["updates"], switch_at)
    k = tl.steps if switch_at == math.inf else bisect_left(tl.update, switch_at)
    k -= k % 2 if is_async else 0
    if k < (2 if is_async else 1):
        host.launch_queue.ops = queued
        return inflight
    tl.truncate(k)
    consume_jitter(host, k)
    step0 = host.sched.step  # the first step the stretch launches
    launches0 = host.launches
    args, fwd_args = record(host, tl, c, step0, inflight.args if is_async else None)
    count(host, tl, c, is_async)
    entries = 1 if c.graph else c.kernels
    host.launch_queue.ops = (queued + [(s, e, entries) for s, e in tl.compute])[-8:]
    new_inflight = hand_over(host, tl, inflight, step0, launches0, args, fwd_args, c.graph)
    host.device.clock_ratio = c.clock_ratio[k - 1]  # as the stretch's last forward left it
    yield host.env.timeout_at(tl.now)
    return new_inflight
