"""A step's small inputs packed into ONE int64 tensor, and the IO slots that carry it.

`pack()` turns a scheduler Batch into a flat int64 array plus a Layout (name -> offset, shape), all
in numpy with no per-token Python loop. An IOSlot owns a pinned host buffer and a device buffer of
the same capacity (so one H2D copy moves every input of a step) plus the sampled-token output
buffers (device, and pinned host for the D2H copy). Decode-only batches padded to a graph bucket
get a fixed layout, so a graph captured on a slot's views replays on any batch of that bucket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from cbsim.costs.attention_groups import attention_groups
from cbsim.costs.eager_tokens import eager_tokens

# distinct lengths whose views a slot keeps (graph buckets and the common eager lengths)
VIEW_CACHE = 64
# Section order: the graph-bucket layout is the same as any decode batch of that size.
SECTIONS = (
    "input_ids",
    "positions",
    "slots",
    "logits_idx",
    "carry",
    "dec_tok",
    "dec_ctx",
    "dec_bt",
    "pre_tok",
    "pre_qlen",
    "ext_tok",
    "ext_qlen",
    "ext_start",
    "ext_bt",
)


@dataclass(frozen=True)
class Layout:
    """Where each input lives in the packed buffer, plus the host-side shape facts of the step."""

    offsets: tuple[tuple[str, int, tuple[int, ...]], ...]
    total: int
    num_tokens: int
    num_sample: int
    all_decode: bool
    # longest chunk of each prefill group (host ints: shapes are static per step): prompts from
    # position 0 ("pre": causal attention over their own keys) and chunks after a cached prefix
    # ("ext": attention over the gathered cache); runtime/attention.py
    pre_qmax: int
    ext_qmax: int = 0

    def views(self, buf: torch.Tensor) -> dict[str, torch.Tensor | None]:
        out: dict[str, torch.Tensor | None] = {}
        for name, off, shape in self.offsets:
            n = math.prod(shape)
            out[name] = buf[off : off + n].view(shape) if n else None
        return out


def make_layout(
    sizes: dict[str, tuple[int, ...]],
    num_tokens: int,
    num_sample: int,
    all_decode: bool,
    pre_qmax: int,
    ext_qmax: int = 0,
) -> Layout:
    offsets, off = [], 0
    for name in SECTIONS:
        shape = sizes.get(name, (0,))
        offsets.append((name, off, shape))
        off += math.prod(shape)
    return Layout(tuple(offsets), off, num_tokens, num_sample, all_decode, pre_qmax, ext_qmax)


def pack(
    batch,
    scratch_block: int,
    carry: np.ndarray | None,
    carry_len: int,
    pad_to: int | None = None,
    width: int | None = None,
    token_multiple: int = 1,
    short_max: int = 0,
) -> tuple[np.ndarray, Layout]:
    """A scheduler Batch's inputs as one int64 array and its Layout.

    pad_to: a decode-only batch padded to that many rows (a graph bucket); width: block-table
    columns (the graph's fixed width; default the batch's longest table); carry: the scheduler's
    carry-over index into this batch (-1 none), padded with -1 to carry_len; token_multiple: a
    batch with prompt tokens padded to ``eager_tokens`` rows (engine.eager_token_multiple), in
    no attention group; short_max: continuations of up to that many tokens as decode rows
    (engine.continuation_decode_max). Padding rows write and read the scratch block only.
    """
    b, t = len(batch), int(batch.query_tokens)
    all_decode = t == b
    carry_arr = np.full(carry_len, -1, dtype=np.int64)
    if carry is not None and len(carry):
        carry_arr[: len(carry)] = carry
    rows = {
        "input_ids": batch.input_ids,
        "positions": batch.positions,
        "slots": batch.slot_mapping,
        "logits_idx": batch.logits_indices,
        "ctx": batch.context_lens,
        "bt": batch.block_table_array(width, pad=scratch_block).astype(np.int64),
    }
    if pad_to is not None:
        if not all_decode or pad_to < b:
            raise ValueError(f"pad_to={pad_to} needs a decode-only batch of at most that size")
        rows = _padded(rows, pad_to - b, scratch_block * batch.block_size, scratch_block)
        b = t = pad_to
    if not all_decode and (pad := eager_tokens(batch, token_multiple) - t):
        scratch_slot = scratch_block * batch.block_size
        rows["input_ids"] = np.concatenate([rows["input_ids"], np.zeros(pad, np.int64)])
        rows["positions"] = np.concatenate([rows["positions"], np.zeros(pad, np.int64)])
        rows["slots"] = np.concatenate([rows["slots"], np.full(pad, scratch_slot, np.int64)])
        t += pad
    parts = {k: rows[k] for k in ("input_ids", "positions", "slots", "logits_idx")}
    parts["carry"] = carry_arr
    if all_decode:
        parts.update(dec_tok=np.arange(b, dtype=np.int64), dec_ctx=rows["ctx"], dec_bt=rows["bt"])
        pre_qmax = ext_qmax = 0
    else:
        pre_qmax, ext_qmax = _attention_groups(batch, rows["ctx"], rows["bt"], parts, short_max)
    layout = make_layout(
        {k: v.shape for k, v in parts.items()},
        num_tokens=t,
        num_sample=int(batch.num_samples),
        all_decode=all_decode,
        pre_qmax=pre_qmax,
        ext_qmax=ext_qmax,
    )
    flat = np.concatenate(
        [np.asarray(parts[k], dtype=np.int64).reshape(-1) for k in SECTIONS if k in parts]
    )
    return flat, layout


def _padded(rows: dict, pad: int, scratch_slot: int, scratch_block: int) -> dict:
    """A decode batch's rows with `pad` padding rows that touch only the scratch block."""
    bt = rows["bt"]
    logits = rows["logits_idx"]
    return {
        "input_ids": np.concatenate([rows["input_ids"], np.zeros(pad, np.int64)]),
        "positions": np.concatenate([rows["positions"], np.zeros(pad, np.int64)]),
        "slots": np.concatenate([rows["slots"], np.full(pad, scratch_slot, np.int64)]),
        "logits_idx": np.concatenate([logits, np.zeros(len(bt) + pad - len(logits), np.int64)]),
        "ctx": np.concatenate([rows["ctx"], np.ones(pad, np.int64)]),
        "bt": np.concatenate([bt, np.full((pad, bt.shape[1]), scratch_block, np.int64)]),
    }


def _attention_groups(
    batch, ctx: np.ndarray, bt: np.ndarray, parts: dict, short_max: int
) -> tuple[int, int]:
    """A mixed step's attention groups (cbsim.costs.attention_groups) into `parts`: decode rows
    (short continuations a row per token), prompt chunks from position 0 ("pre"), longer chunks
    after a cached prefix ("ext", with their own table width); returns the longest chunk of
    each prefill group."""
    q, start = batch.query_lens, batch.start_pos
    tok_start = batch.cu_query_lens[:-1]
    g = attention_groups(q, start, ctx, short_max)
    parts.update(dec_tok=tok_start[g.dec_req] + g.dec_off, dec_ctx=g.dec_ctx, dec_bt=bt[g.dec_req])
    pre, ext = g.fresh, g.ext
    pre_qmax = ext_qmax = 0
    if len(pre):
        pre_qmax = int(q[pre].max())
        parts.update(pre_tok=tok_start[pre], pre_qlen=q[pre])
    if len(ext):
        ext_qmax = int(q[ext].max())
        width = -(-int(ctx[ext].max()) // batch.block_size)
        parts.update(
            ext_tok=tok_start[ext], ext_qlen=q[ext], ext_start=start[ext], ext_bt=bt[ext][:, :width]
        )
    return pre_qmax, ext_qmax


def empty_decode_layout(pad_to: int, width: int, carry_len: int) -> Layout:
    """The fixed layout of a decode batch padded to `pad_to` rows (what a graph is captured on)."""
    sizes = {
        "input_ids": (pad_to,),
        "positions": (pad_to,),
        "slots": (pad_to,),
        "logits_idx": (pad_to,),
        "carry": (carry_len,),
        "dec_tok": (pad_to,),
        "dec_ctx": (pad_to,),
        "dec_bt": (pad_to, width),
    }
    return make_layout(sizes, num_tokens=pad_to, num_sample=pad_to, all_decode=True, pre_qmax=0)


@dataclass
class DecodeWritten:
    """What a slot's pinned buffer holds from the graph-bucket step last written into it: the
    bucket layout, the scheduler's request-index array and flat block table of that batch, and
    the blocks per row written."""

    layout: Layout
    idx: np.ndarray
    flat: np.ndarray
    num_blocks: np.ndarray


def pack_decode_into(
    dst: np.ndarray,
    batch,
    layout: Layout,
    scratch_block: int,
    carry: np.ndarray | None,
    written: DecodeWritten | None = None,
) -> tuple[Layout, DecodeWritten]:
    """The graph-bucket fast path: write a decode-only batch padded to `layout` (an
    `empty_decode_layout`) straight into `dst` (the slot's pinned buffer, as numpy); the same
    entries as `pack(..., pad_to=..., width=...)`, with no intermediate arrays.

    `written`: what the slot holds from its last graph step. When that was the same steady
    decode (the scheduler hands out one request-index array per steady run of the same
    requests, and their block ids only grow at the end while it lasts), only what changes is
    written: ids, positions, KV slots, context lengths, the carry-over, and the new block ids
    of the rows that opened a block. Returns the layout with the batch's sample count and what
    the slot now holds."""
    at = {name: off for name, off, _ in layout.offsets}
    b, rows = len(batch), layout.num_tokens
    o = at["dec_bt"]
    width = (layout.total - o) // rows
    bt = dst[o : o + rows * width].reshape(rows, width)
    nb = batch.num_blocks
    same = (
        written is not None
        and written.layout is layout
        and written.idx is batch.idx
        and written.flat is batch._flat
    )
    if same:
        old = written.num_blocks
        seg, flat = batch._seg, batch._flat
        for i in np.flatnonzero(nb != old).tolist():
            lo, hi = int(old[i]), int(nb[i])
            bt[i, lo:hi] = flat[seg[i] + lo : seg[i] + hi]
    else:
        _write_decode_constants(dst, at, b, rows, batch, scratch_block)
        bt[:b] = batch.block_table_array(width, pad=scratch_block)
        bt[b:] = scratch_block
    dst[at["input_ids"] : at["input_ids"] + b] = batch.input_ids
    dst[at["positions"] : at["positions"] + b] = batch.start_pos  # one query token each
    dst[at["slots"] : at["slots"] + b] = batch.slot_mapping
    dst[at["dec_ctx"] : at["dec_ctx"] + b] = batch.context_lens
    o, n = at["carry"], at["dec_tok"] - at["carry"]
    if carry is not None and len(carry):
        dst[o : o + len(carry)] = carry
        dst[o + len(carry) : o + n] = -1
    else:
        dst[o : o + n] = -1
    out = Layout(layout.offsets, layout.total, rows, int(batch.num_samples), True, 0)
    return out, DecodeWritten(layout, batch.idx, batch._flat, nb.copy())


def _write_decode_constants(
    dst: np.ndarray, at: dict[str, int], b: int, rows: int, batch, scratch_block: int
) -> None:
    """The entries that stay put while the same requests decode: padding rows, logits
    indices, token indices."""
    bs = batch.block_size
    for name, pad in (("input_ids", 0), ("positions", 0), ("slots", scratch_block * bs)):
        dst[at[name] + b : at[name] + rows] = pad
    o, li = at["logits_idx"], batch.logits_indices
    dst[o : o + li.size] = li
    dst[o + li.size : o + rows] = 0
    o = at["dec_tok"]
    dst[o : o + rows] = np.arange(rows)
    o = at["dec_ctx"]
    dst[o + b : o + rows] = 1


def dummy_decode(layout: Layout, scratch_block: int, block_size: int) -> np.ndarray:
    """Inputs for `empty_decode_layout`: every row a padding row (graph warm-up and capture)."""
    flat = np.zeros(layout.total, dtype=np.int64)
    for name, off, shape in layout.offsets:
        n = math.prod(shape)
        if name == "slots":
            flat[off : off + n] = scratch_block * block_size
        elif name == "carry":
            flat[off : off + n] = -1
        elif name == "dec_tok":
            flat[off : off + n] = np.arange(n)
        elif name == "dec_ctx":
            flat[off : off + n] = 1
        elif name == "dec_bt":
            flat[off : off + n] = scratch_block
    return flat


def dummy_prefill(
    tokens: int, block_size: int, scratch_block: int, carry_len: int, fresh: bool = True
):
    """One prompt chunk of `tokens` tokens that writes and reads only the scratch block (the
    warm-up of the eager prefill path: library set-up, kernel choice, allocator growth);
    fresh=False takes the cached-prefix ("ext") path."""
    width = -(-tokens // block_size)
    parts = {
        "input_ids": np.zeros(tokens, np.int64),
        "positions": np.arange(tokens, dtype=np.int64),
        "slots": scratch_block * block_size + np.arange(tokens, dtype=np.int64) % block_size,
        "logits_idx": np.array([tokens - 1], np.int64),
        "carry": np.full(carry_len, -1, np.int64),
    }
    group = (
        {"pre_tok": np.zeros(1, np.int64), "pre_qlen": np.array([tokens], np.int64)}
        if fresh
        else {
            "ext_tok": np.zeros(1, np.int64),
            "ext_qlen": np.array([tokens], np.int64),
            "ext_start": np.zeros(1, np.int64),
            "ext_bt": np.full((1, width), scratch_block, np.int64),
        }
    )
    parts.update(group)
    layout = make_layout(
        {k: v.shape for k, v in parts.items()},
        num_tokens=tokens,
        num_sample=1,
        all_decode=False,
        pre_qmax=tokens if fresh else 0,
        ext_qmax=0 if fresh else tokens,
    )
    flat = np.concatenate([parts[k].reshape(-1) for k in SECTIONS if k in parts])
    return flat, layout


class IOSlot:
    """One IO slot: pinned host + device input buffer, device + pinned host token outputs."""

    def __init__(self, index: int, capacity: int, max_outputs: int, device: torch.device) -> None:
        pin = device.type == "cuda"
        self.index = index
        self.capacity = capacity
        self.host_in = torch.zeros(capacity, dtype=torch.int64, pin_memory=pin)
        self.dev_in = torch.zeros(capacity, dtype=torch.int64, device=device)
        self.dev_out = torch.zeros(max_outputs, dtype=torch.int64, device=device)
        self.host_out = torch.zeros(max_outputs, dtype=torch.int64, pin_memory=pin)
        self.host_np = self.host_in.numpy()  # the pinned buffers as numpy (no copy)
        self.host_out_np = self.host_out.numpy()
        self.last_compute_done = None  # the event of the last forward that read dev_in
        self.written: DecodeWritten | None = None  # the graph step last packed into host_np
        # views by length, made once per length (graph buckets: a few lengths, every step)
        self._in_views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._out_views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def input_views(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(device, pinned host) views of the first n input entries."""
        return _first(self._in_views, n, self.dev_in, self.host_in)

    def output_views(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(pinned host, device) views of the first n sampled tokens."""
        return _first(self._out_views, n, self.host_out, self.dev_out)

    @property
    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for t in (self.host_in, self.dev_in, self.dev_out, self.host_out)
        )

    def write(self, flat: np.ndarray) -> None:
        """An eager step's packed inputs (whatever a graph step left here is overwritten)."""
        if flat.size > self.capacity:
            raise RuntimeError(
                f"step inputs of {flat.size} entries exceed the IO slot's "
                f"{self.capacity}; raise the capacity estimate"
            )
        self.host_np[: flat.size] = flat
        self.written = None


def slot_capacity(max_tokens: int, max_requests: int, max_width: int) -> int:
    """Entries an IO buffer needs for any step: 3 per token, 5 + width per request (+ carry)."""
    return 3 * max_tokens + max_requests * (8 + max_width) + 16


def _first(
    cache: dict[int, tuple[torch.Tensor, torch.Tensor]], n: int, a: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The views of the first n entries of a and b, made once per length: a step's copies take
    them every step, and graph buckets use a few lengths (at most VIEW_CACHE kept)."""
    v = cache.get(n)
    if v is None:
        v = (a[:n], b[:n])
        if len(cache) < VIEW_CACHE:
            cache[n] = v
    return v
