"""Hand-made sync/async loop traces for the report and sweep tests (no simulator needed).

The shapes follow the brief: the sync host runs schedule, prepare, launch, then waits for the
step's D2H and updates; the async host prepares batch N+1 while the GPU runs batch N and blocks
once per step, on batch N's D2H. GPU ops queue in order on three streams.
"""

from __future__ import annotations

from cbsim.trace import Trace, TraceBuilder
from cbsim.trace import schema as S


def loop_trace(
    engine: str,
    steps: int,
    batch_size: int = 32,
    cpu_us: float = 900.0,
    gpu_us: float = 2800.0,
    copy_us: float = 20.0,
    hazards: int = 0,
) -> Trace:
    """A decode loop of `steps` steps; cpu_us is the host's per-step work, gpu_us the forward."""
    asynchronous = engine == "async"
    b = TraceBuilder("sim", {"engine": engine})
    sched, prep, launch, upd = 0.15 * cpu_us, 0.55 * cpu_us, 0.1 * cpu_us, 0.2 * cpu_us
    h2d_end = compute_end = d2h_end = 0.0
    d2h_done: list[float] = []
    args = {"requests": batch_size, "query_tokens": batch_size, "kind": "decode"}

    def enqueue(step: int, t: float) -> float:
        """Host phases that build and launch `step`; returns when the host is free again."""
        nonlocal h2d_end, compute_end, d2h_end
        slot = step % 2 if asynchronous else 0
        kv = batch_size * (256 + step)
        for name, dur in ((S.SCHEDULE, sched), (S.PREPARE, prep), (S.LAUNCH, launch)):
            b.span(S.HOST, name, t, dur, step=step, slot=slot, kv_tokens=kv, **args)
            t += dur
        s = max(t, h2d_end)
        b.span(S.H2D, S.COPY_H2D, s, copy_us, step=step, slot=slot, **args)
        h2d_end = s + copy_us
        s = max(h2d_end, compute_end)
        if asynchronous:
            b.span(S.COMPUTE, S.CARRY_OVER, s, 3.0, step=step, slot=slot, **args)
            s += 3.0
        g = gpu_us * (1 + 0.1 * step / max(steps, 1))
        b.span(
            S.COMPUTE,
            S.GRAPH_REPLAY,
            s,
            g,
            step=step,
            slot=slot,
            kv_tokens=kv,
            new_tokens=batch_size,
            **args,
        )
        compute_end = s + g
        s = max(compute_end, d2h_end)
        b.span(S.D2H, S.COPY_D2H, s, copy_us, step=step, slot=slot, **args)
        d2h_end = s + copy_us
        d2h_done.append(d2h_end)
        return t

    def finish(step: int, t: float) -> float:
        """Block on `step`'s D2H, then append its tokens."""
        slot = step % 2 if asynchronous else 0
        end = max(t, d2h_done[step] + 5.0)
        b.span(S.HOST, S.WAIT, t, end - t, step=step, slot=slot, **args)
        b.span(S.HOST, S.UPDATE, end, upd, step=step, slot=slot, **args)
        return end + upd

    for rid in range(batch_size):
        b.request_event(S.ARRIVAL, 0.0, rid)
    t = 0.0
    if asynchronous:
        t = enqueue(0, t)
        for step in range(1, steps):
            t = enqueue(step, t)
            t = finish(step - 1, t)
            if step == 1:
                for rid in range(batch_size):
                    b.request_event(S.FIRST_TOKEN, t, rid)
        t = finish(steps - 1, t)
    else:
        for step in range(steps):
            t = finish(step, enqueue(step, t))
            if step == 0:
                for rid in range(batch_size):
                    b.request_event(S.FIRST_TOKEN, t, rid)
    for rid in range(batch_size):
        b.request_event(S.FINISH, t, rid, tokens=steps)
    for i in range(hazards):
        step = (i * 7) % steps
        b.hazard(
            S.H2D,
            d2h_done[step] - copy_us,
            "slot_overwrite",
            step,
            step % 2,
            detail="host wrote slot while H2D read it",
        )
    b.counter(S.SCHEDULER_COUNTER, 0.0, waiting=0, running=batch_size, kv_blocks_used=16)
    return b.build()


def cost_model(batch_size: int, gen_len: int) -> tuple[float, float]:
    """Per-step host and GPU time (us) for a sweep: the GPU grows with KV, the host with batch."""
    cpu = 600.0 + 40.0 * batch_size
    gpu = 1500.0 + 0.25 * batch_size * gen_len / 64 + 20.0 * batch_size
    return cpu, gpu
