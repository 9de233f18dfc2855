"""IO slots and the hazards a wrong slot or a missing event wait lets through.

A slot is four buffers, each with an owner history: pinned inputs (the host writes them in
prepare, the H2D copy reads them), device inputs (H2D writes, compute reads), device outputs
(compute writes the sampled tokens; the D2H copy and the next batch's in-graph carry-over read
them) and pinned outputs (D2H writes, the host reads them in update).

A hazard is a conflicting access that nothing orders (streams.happens_before): a write to a buffer
an earlier reader may still be reading (``slot_overwrite``), a read of a buffer whose writer may
not have finished (``missing_event_wait``), or a token consumed before the forward that samples it
is known to be done (``carry_over_before_ready``). It is a race, reported whether or not this
run's timing happened to dodge it (the detail says which: "overlapped by X us" or "latent").
"""

from __future__ import annotations

from collections.abc import Callable

from cbsim.sim.streams import Op, happens_before

# (kind, lane, ts, step, slot, detail)
HazardSink = Callable[[str, str, float, int, int, str], None]


def _who(op: Op | None, step: int) -> str:
    return f"host (step {step})" if op is None else f"{op.name} of step {step}"


class Buffer:
    """One buffer: its last writer and the readers since."""

    __slots__ = ("name", "writer", "writer_step", "readers")

    def __init__(self, name: str) -> None:
        self.name = name
        self.writer: Op | None = None
        self.writer_step = -1
        self.readers: list[tuple[Op | None, int]] = []


class IOSlot:
    """One IO slot: four buffers and the index used in the trace."""

    __slots__ = ("index", "pinned_in", "dev_in", "dev_out", "pinned_out")

    def __init__(self, index: int) -> None:
        self.index = index
        self.pinned_in = Buffer("pinned inputs")
        self.dev_in = Buffer("device inputs")
        self.dev_out = Buffer("device outputs")
        self.pinned_out = Buffer("pinned outputs")


class SlotTracker:
    """Checks every buffer access of every step against the happens-before order."""

    def __init__(self, io_slots: int, sink: HazardSink) -> None:
        self.slots = [IOSlot(i) for i in range(io_slots)]
        self.sink = sink

    def slot_for(self, launch_index: int) -> IOSlot:
        return self.slots[launch_index % len(self.slots)]

    # ---- accesses --------------------------------------------------------------------------
    def write(
        self, slot: IOSlot, buf: Buffer, op: Op | None, vc, step: int, lane: str, t0: float
    ) -> None:
        """``op`` (None: the host at ``t0`` knowing ``vc``) writes ``buf`` for ``step``."""
        for reader, rstep in buf.readers:
            # inlined happens_before (the hot path: several checks per step)
            if rstep != step and reader is not None and vc[reader.stream] < reader.seq:
                self._report(
                    "slot_overwrite",
                    lane,
                    t0,
                    step,
                    slot,
                    buf,
                    reader,
                    rstep,
                    op,
                    "writes",
                    "may still be reading them",
                )
        buf.writer, buf.writer_step, buf.readers = op, step, []

    def read(
        self,
        slot: IOSlot,
        buf: Buffer,
        op: Op | None,
        vc,
        step: int,
        lane: str,
        t0: float,
        kind: str = "missing_event_wait",
    ) -> None:
        """``op`` reads ``buf``; flags a writer not ordered before it."""
        w = buf.writer
        if w is not None and vc[w.stream] < w.seq:
            self._report(
                kind,
                lane,
                t0,
                step,
                slot,
                buf,
                buf.writer,
                buf.writer_step,
                op,
                "reads",
                "may not have finished writing them",
            )
        buf.readers.append((op, step))

    def host_reads_outputs(self, slot: IOSlot, step: int, lane: str, t0: float) -> None:
        """The host reads step's tokens from the pinned outputs in update: a later step's D2H
        already enqueued into the same slot has overwritten them, or is about to."""
        buf = slot.pinned_out
        if buf.writer_step != step and buf.writer is not None:
            done = buf.writer.end <= t0
            self.sink(
                "slot_overwrite",
                lane,
                t0,
                step,
                slot.index,
                f"host reads step {step}'s tokens from slot {slot.index}'s {buf.name}, but "
                f"{buf.writer.name} of step {buf.writer_step} was enqueued into them first ("
                + ("already overwritten)" if done else "racing with it)"),
            )
        buf.readers.append((None, step))

    def token_ready(
        self,
        producer: Op,
        vc,
        consumer: str,
        step: int,
        lane: str,
        t0: float,
        slot: IOSlot,
        producer_step: int,
    ) -> None:
        """A token sampled by ``producer`` is consumed at ``t0`` by ``consumer`` knowing ``vc``."""
        if not happens_before(producer, vc):
            early = producer.end - t0
            self.sink(
                "carry_over_before_ready",
                lane,
                t0,
                step,
                slot.index,
                f"{consumer} of step {step} uses a token of step {producer_step} without "
                f"knowing its forward finished ("
                + (f"{early:.1f} us before it did)" if early > 0 else "latent)"),
            )

    # ---- reporting -------------------------------------------------------------------------
    def _report(
        self,
        kind: str,
        lane: str,
        t0: float,
        step: int,
        slot: IOSlot,
        buf: Buffer,
        other: Op | None,
        other_step: int,
        op: Op | None,
        verb: str,
        what: str,
    ) -> None:
        start = t0 if op is None else op.start
        end = start if op is None else op.end
        if other is None:
            overlap = 0.0
        else:
            overlap = min(end, other.end) - max(start, other.start)
            if op is None:
                overlap = other.end - start
        timing = f"overlapped by {overlap:.1f} us" if overlap > 0 else "latent"
        self.sink(
            kind,
            lane,
            start,
            step,
            slot.index,
            f"{_who(op, step)} {verb} slot {slot.index}'s {buf.name} while "
            f"{_who(other, other_step)} {what} (no event or sync orders them; {timing})",
        )
