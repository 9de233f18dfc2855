"""After a steady stretch: the scheduler, sampler, streams, launch queue and IO slots as stepping
would have left them.

The event structure of every step is the same (H2D, compute waiting on h2d_done, D2H waiting on
compute_done, the host waiting on one D2H), so after ``k`` more steps every vector-clock
component, every stream's op count and every step number in the IO slots' access history is
``k`` larger; only the times are new, and the stretch's timeline holds them.
"""

from __future__ import annotations

from typing import Any

from cbsim.sim.host_state import HostState, Launched
from cbsim.sim.streams import CudaEvent, Op
from cbsim.sim.stretch import Timeline
from cbsim.sim.tokens import KEEP_TOKEN
from cbsim.trace import schema as S


def hand_over(
    host: HostState,
    tl: Timeline,
    inflight: Launched | None,
    step0: int,
    launches0: int,
    args: dict[str, Any],
    fwd_args: dict[str, Any],
    graph: bool,
) -> Launched | None:
    """Advance everything by the stretch's ``tl.steps`` steps (the first launched is ``step0``);
    returns the batch then in flight (async) or None."""
    k = tl.steps
    shift = _Shift(host, tl, k, step0, S.GRAPH_REPLAY if graph else S.FORWARD)
    batch = _advance_scheduler(host, tl, inflight, k)
    dev = host.device
    for stream, ops in ((dev.h2d, tl.h2d), (dev.compute, tl.compute), (dev.d2h, tl.d2h)):
        stream.tail = ops[-1][1]
        stream.seq += k
        stream.vc = [v + k for v in stream.vc]
    dev.host_vc = [v + k for v in dev.host_vc]
    for slot in host.slots.slots:
        for buf in (slot.pinned_in, slot.dev_in, slot.dev_out, slot.pinned_out):
            buf.writer = shift.op(buf.writer, buf.writer_step)
            buf.writer_step += k
            buf.readers = [(shift.op(op, st), st + k) for op, st in buf.readers]
    done = host.last_updated
    host.last_updated = Launched(
        None, done.slot, {}, None, shift.op(done.compute, done.step), None, None, {}, done.step + k
    )
    if inflight is None:
        return None
    vc = tuple(v + k for v in inflight.d2h_done.vc)
    return Launched(
        batch,
        host.slots.slot_for(launches0 + k - 1),
        args,
        shift.op(inflight.h2d, inflight.step),
        shift.op(inflight.compute, inflight.step),
        shift.op(inflight.d2h, inflight.step),
        CudaEvent(tl.d2h[-1][1], vc),
        fwd_args,
        inflight.step + k,
    )


def _advance_scheduler(host: HostState, tl: Timeline, inflight: Launched | None, k: int):
    """Schedules and updates of the stretch; the async loop's batch in flight is built for
    real (the next update and the carry-over read it)."""
    sched, sampler = host.sched, host.sampler
    run = sched.run
    rids = sched.table.rid[run]
    if inflight is None:  # sync: k schedules, each updated before the next
        sched.decode.skip(k)
        sched.updates.skip(run, k, KEEP_TOKEN)
        sampler.skip(rids, k)
        return None
    # async: schedules of the k steps after the one in flight, updates of it and k - 1 more
    sched.decode.skip(k - 1)
    tokens, _ = sampler.sample(inflight.batch)
    finished = sched.update(inflight.batch, tokens)
    assert not finished and not sched.last_first_token_rids, "a plain steady update"
    sched.updates.skip(run, k - 2, KEEP_TOKEN)
    now_s = tl.sched[-1] * 1e-6 * (1.0 + 1e-15) + 1e-12
    batch = sched.schedule(now_s)
    assert batch is not None and batch.kind == "decode" and batch.num_requests == run.size
    sched.updates.skip(run, 1, KEEP_TOKEN)
    sampler.skip(rids, k - 1)
    return batch


class _Shift:
    """An op of step ``st`` before the stretch -> the same op of step ``st + k``."""

    def __init__(self, host: HostState, tl: Timeline, k: int, step0: int, name: str) -> None:
        self.tl, self.k, self.step0, self.name = tl, k, step0, name
        self.compute = host.device.compute.index
        self.done: dict[int, Op] = {}

    def op(self, op: Op | None, step: int) -> Op | None:
        if op is None:
            return None
        got = self.done.get(id(op))
        if got is None:
            j = step + self.k - self.step0  # its index in the stretch
            times = (self.tl.h2d, self.tl.compute, self.tl.d2h)[op.stream][j]
            name = self.name if op.stream == self.compute else op.name
            vc = tuple(v + self.k for v in op.vc)
            got = self.done[id(op)] = Op(op.stream, op.seq + self.k, op.lane, name, *times, vc)
        return got
