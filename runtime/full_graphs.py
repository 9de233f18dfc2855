"""Steps with prompt tokens replayed from one CUDA graph per token bucket (engine.mixed_graphs=full).

What cbsim/costs/mixed_graphs.py models as the full replay: the whole forward of a step with prompt
tokens (carry-over, every layer with its attention, the LM head over the sampled rows, the argmax)
is one graph per (IO slot, token bucket), so the host launches a step as it launches a decode
graph. Attention is inside the graph because it runs one kernel over fixed-capacity metadata
(runtime/kernels/varlen_attention.py): every sequence of the step as (first token row, query
length, context length, block-table row), up to ``sequences`` entries, and a tile work list sized
for the bucket. How the step's tokens split into requests lives in that metadata, which the host
writes each step, not in the graph's shapes; the kernel reads only live rows and live KV.

Layout of a bucket's step in the IO buffer (fixed offsets and shapes per bucket): the token rows
(ids, positions, KV slots) padded to the bucket, the logits indices padded to ``max_outputs`` (the
padding pointing at the last row), the carry-over, then the per-sequence metadata and the tiles.
Padding token rows write the scratch block and belong to no sequence; attention writes into one
buffer outside the graph pool (``out``), whose padding rows keep whatever finite values they held.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import torch

from cbsim.config.errors import ConfigError

from .graph_memsets import capture_graph
from .io_slots import IOSlot, Layout
from .kernels.varlen_attention import (
    tile_capacity,
    tile_map,
    tokens_per_tile,
    varlen_attention_reference,
)
from .piecewise import attention_out

# the sections of a full-graph step, in buffer order
FULL_SECTIONS = (
    "input_ids",
    "positions",
    "slots",
    "logits_idx",
    "carry",
    "var_q0",
    "var_qlen",
    "var_ctx",
    "var_bt",
    "var_tile_seq",
    "var_tile_q",
)
VAR_SECTIONS = FULL_SECTIONS[5:]


def full_layout(tokens: int, logits: int, carry: int, seqs: int, width: int, tiles: int) -> Layout:
    """The fixed layout of a bucket of ``tokens`` rows."""
    sizes = {
        "input_ids": (tokens,),
        "positions": (tokens,),
        "slots": (tokens,),
        "logits_idx": (logits,),
        "carry": (carry,),
        "var_q0": (seqs,),
        "var_qlen": (seqs,),
        "var_ctx": (seqs,),
        "var_bt": (seqs, width),
        "var_tile_seq": (tiles,),
        "var_tile_q": (tiles,),
    }
    offsets, off = [], 0
    for name in FULL_SECTIONS:
        offsets.append((name, off, sizes[name]))
        off += math.prod(sizes[name])
    return Layout(tuple(offsets), off, tokens, logits, all_decode=False, pre_qmax=0)


def _padded(a: np.ndarray, n: int, fill: int) -> np.ndarray:
    out = np.full((n, *a.shape[1:]), fill, np.int64)
    out[: len(a)] = a
    return out


class FullGraphs:
    """The runner's full mixed-step graphs: the buckets' layouts, the attention output buffer,
    one graph per (slot, bucket), and a step's packing and replay."""

    pieces = 1  # graphs a step replays (StepPlan.pieces)

    def __init__(self, runner, buckets: list[int]) -> None:
        self.runner = runner
        self.buckets = list(buckets)
        s = runner.shape
        self.block_q = tokens_per_tile(s["num_heads"], s["num_kv_heads"])
        self.seqs = runner.max_outputs  # a step holds at most a batch of requests
        self.tiles = {b: tile_capacity(b, self.seqs, self.block_q) for b in self.buckets}
        self.layouts = {b: self._layout(runner, b, self.seqs, self.tiles[b]) for b in self.buckets}
        self.out = attention_out(runner, max(buckets))
        self.attention = self._kernel(runner)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    @staticmethod
    def _kernel(runner):
        if runner.device.type != "cuda":
            return reference_attention  # the CPU emulation: torch, a sequence at a time
        if runner.decode_kernel is None:
            raise ConfigError(
                "engine.mixed_graphs=full runs attention in a Triton kernel inside the graph; "
                "it needs mode.attention=triton or auto with triton installed; allowed "
                "otherwise: engine.mixed_graphs=buckets or off"
            )
        from .kernels.varlen_attention import varlen_paged_attention

        return varlen_paged_attention

    @staticmethod
    def _layout(runner, bucket: int, seqs: int, tiles: int) -> Layout:
        return full_layout(
            bucket, runner.max_outputs, runner.carry_len, seqs, runner.graph_width, tiles
        )

    @classmethod
    def entries(cls, runner, buckets: list[int], block_q: int) -> int:
        """IO-buffer entries the largest bucket's layout takes (the slots are sized for it)."""
        b, seqs = max(buckets), runner.max_outputs
        return cls._layout(runner, b, seqs, tile_capacity(b, seqs, block_q)).total

    @property
    def out_bytes(self) -> int:
        return self.out.numel() * self.out.element_size()

    @property
    def num_graphs(self) -> int:
        return len(self.graphs)

    @property
    def sets(self) -> dict:
        return self.graphs

    def pack(self, batch, carry: np.ndarray | None, bucket: int) -> tuple[np.ndarray, Layout]:
        """A step with prompt tokens in its bucket's layout (see the module docstring)."""
        r, layout = self.runner, self.layouts[bucket]
        scratch = r.cache.scratch_block
        t, n = int(batch.query_tokens), len(batch)
        if n > self.seqs:
            raise RuntimeError(f"{n} requests exceed the full graphs' {self.seqs} sequences")
        qlen = _padded(batch.query_lens, self.seqs, 0)
        tile_seq, tile_q = tile_map(qlen, self.tiles[bucket], self.block_q)
        carry_arr = np.full(r.carry_len, -1, np.int64)
        if carry is not None and len(carry):
            carry_arr[: len(carry)] = carry
        parts = {
            "input_ids": _padded(batch.input_ids, bucket, 0),
            "positions": _padded(batch.positions, bucket, 0),
            "slots": _padded(batch.slot_mapping, bucket, scratch * r.block_size),
            "logits_idx": _padded(batch.logits_indices, r.max_outputs, bucket - 1),
            "carry": carry_arr,
            "var_q0": _padded(batch.cu_query_lens[:-1], self.seqs, t),
            "var_qlen": qlen,
            "var_ctx": _padded(batch.context_lens, self.seqs, 0),
            "var_bt": _padded(
                batch.block_table_array(r.graph_width, pad=scratch), self.seqs, scratch
            ),
            "var_tile_seq": tile_seq,
            "var_tile_q": tile_q,
        }
        flat = np.concatenate([parts[k].reshape(-1) for k in FULL_SECTIONS])
        return flat, Layout(layout.offsets, layout.total, bucket, int(batch.num_samples), False, 0)

    def _dummy(self, bucket: int) -> np.ndarray:
        """A bucket of padding rows and one prompt of at most a block table's tokens that
        writes and reads the scratch block only (warm-up and capture)."""
        r, layout = self.runner, self.layouts[bucket]
        flat = np.zeros(layout.total, np.int64)
        at = {name: (off, math.prod(shape)) for name, off, shape in layout.offsets}
        n = min(bucket, r.graph_width * r.block_size)
        scratch = r.cache.scratch_block
        fills = {
            "slots": scratch * r.block_size,
            "logits_idx": bucket - 1,
            "carry": -1,
            "var_bt": scratch,
            "var_tile_seq": -1,
        }
        for name, value in fills.items():
            off, size = at[name]
            flat[off : off + size] = value
        for name, value in (("var_qlen", n), ("var_ctx", n)):
            flat[at[name][0]] = value
        tiles = -(-n // self.block_q)
        off = at["var_tile_seq"][0]
        flat[off : off + tiles] = 0
        off = at["var_tile_q"][0]
        flat[off : off + tiles] = np.arange(tiles) * self.block_q
        return flat

    @torch.inference_mode()
    def body(self, slot: IOSlot, layout: Layout) -> None:
        r = self.runner
        v = layout.views(slot.dev_in)
        meta = r.attn_meta(
            v,
            layout,
            out=self.out,
            varlen=self.attention,
            **{name: v[name] for name in VAR_SECTIONS},
        )
        r.carry_in(slot, v)
        r.forward(slot, v, meta)

    def run(self, slot: IOSlot, layout: Layout, bucket: int) -> None:
        """Replay the (slot, bucket) graph; the same forward eagerly where none was captured
        (the CPU emulation)."""
        graph = self.graphs.get((slot.index, bucket))
        if graph is None:
            self.body(slot, layout)
        else:
            graph.replay()

    def capture(self, stream: torch.cuda.Stream, pool: tuple) -> None:
        """Every (slot, bucket), largest bucket first, on ``pool`` (the decode graphs' one),
        after a warm-up forward per bucket (Triton compiles, cuBLAS picks its kernels); with
        engine.upload_graphs each replayed once on its dummy, as a graph's first launch uploads
        it (0.41 ms against 0.13 ms for later replays, a 3B on the H100)."""
        order = sorted(self.buckets, reverse=True)
        with torch.cuda.stream(stream):
            for b in order:
                self._load(self.runner.slots[0], b)
                self.body(self.runner.slots[0], self.layouts[b])
        torch.cuda.synchronize()
        for slot in self.runner.slots:
            for b in order:
                self._load(slot, b)
                body = partial(self.body, slot, self.layouts[b])
                graph = capture_graph(body, pool, stream, self.runner.memsets)
                self.graphs[(slot.index, b)] = graph
                if self.runner.upload_graphs:  # the first launch uploads it: not in a step
                    graph.replay()
        torch.cuda.synchronize()

    def _load(self, slot: IOSlot, bucket: int) -> None:
        flat = self._dummy(bucket)
        slot.dev_in[: flat.size].copy_(torch.from_numpy(flat).to(self.runner.device))


def reference_attention(q, k_cache, v_cache, out, q0, qlen, ctx, bt, tile_seq, tile_q, scale):
    """The CPU emulation's attention: the torch version over the same metadata."""
    return varlen_attention_reference(q, k_cache, v_cache, out, q0, qlen, ctx, bt, scale)
