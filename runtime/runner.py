"""The model runner: owns the device side (model, paged KV cache, IO slots, CUDA graphs).

One step's device work is `step_body`: the in-graph token carry-over, the forward over packed
varlen input ([1, T] ids and positions, logits only at sampled positions) and greedy sampling into
the slot's output buffer. Decode-only batches up to the largest graph bucket replay a graph
captured per (slot, bucket, table width); all graphs share one memory pool, so two slots cost
about one. The widths are the decode kernel's launch classes (cbsim.costs.decode_kernel): a step
replays the narrowest table that holds its longest request, so attention runs as it would over a
table as wide as that request, not the run's longest.
Steps with prompt tokens replay graphs per (slot, token bucket): piecewise with
engine.mixed_graphs=buckets (runtime/piecewise.py: attention eager between the pieces), one whole
forward with engine.mixed_graphs=full (runtime/full_graphs.py: attention inside the graph).
Everything else runs the same body eagerly. The runner issues work on the current stream; the
engines choose the streams and the events between them.
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from cbsim.config.schema import CbsimConfig
from cbsim.costs.attention_groups import max_decode_rows
from cbsim.costs.decode_kernel import LaunchRule, class_width, launch_classes
from cbsim.costs.eager_tokens import round_up
from cbsim.costs.mixed_graphs import bucket_of, buckets_of, mixed_graphs_mode

from .attention import ATTN_NAME, AttnMeta, load_decode_kernel, register
from .device_info import select_blas
from .full_graphs import FullGraphs
from .graph_memsets import MemsetRewriter, capture_graph
from .io_slots import (
    SECTIONS,
    IOSlot,
    Layout,
    dummy_decode,
    empty_decode_layout,
    pack,
    pack_decode_into,
    slot_capacity,
)
from .kernels.sampling import argmax_rows
from .kernels.varlen_attention import tokens_per_tile
from .kv_cache import PagedKVCache
from .model import DTYPES, build_model, model_shape
from .piecewise import MixedGraphs

# the IO buffer's sections that are AttnMeta fields of the same name (the attention groups'
# tensors): a forward passes their views to AttnMeta by name
META_SECTIONS = tuple(s for s in SECTIONS if s in {f.name for f in dataclasses.fields(AttnMeta)})


@dataclass
class StepPlan:
    """What the host prepared for one step: the slot, the layout and the graph bucket (or None)."""

    batch: object  # cbsim.scheduler.Batch
    slot: IOSlot
    layout: Layout
    bucket: int | None
    num_entries: int
    width: int | None = None  # the graph's block-table width (blocks), for a graph step
    tokens_bucket: int | None = None  # a step with prompt tokens: its piecewise graphs' bucket
    # graphs the forward replays: 0 eager, 1 a decode graph, layers + 1 a piecewise replay
    pieces: int = 0
    # the forward span's args once launched: new_tokens is settled in update (EOS drops some)
    forward_args: dict | None = None


def runtime_model(
    config: CbsimConfig, device: torch.device, model: torch.nn.Module | None
) -> torch.nn.Module:
    """The model the runner drives: built from the config and, on CUDA, fused as mode.fuse_*
    ask (runtime/kernels: projections, norm and rope, epilogues, rope in the K/V write), or the
    model passed in, as it is, with its attention switched to the paged cache."""
    if model is not None:
        register()
        model.config._attn_implementation = ATTN_NAME
        return model
    model = build_model(config.model, device, seed=config.workload.seed)
    if device.type == "cuda" and config.mode.fuse_projections:
        from .kernels.fused_projections import fuse_qkv_and_gate_up

        fuse_qkv_and_gate_up(model)
    if device.type == "cuda" and config.mode.fuse_norm_rope:
        from .kernels.fused_elementwise import fuse_norm_and_rope

        fuse_norm_and_rope(model)
    if device.type == "cuda" and config.mode.fuse_epilogues:
        from .kernels.fused_epilogues import fuse_epilogues

        fuse_epilogues(model, rope_kv_write=config.mode.rope_in_kv_write())
    return model


class ModelRunner:
    def __init__(
        self,
        config: CbsimConfig,
        device: torch.device,
        *,
        num_kv_blocks: int,
        max_context: int,
        num_slots: int,
        carry_over: bool,
        graphs: bool,
        emulate_graphs: bool = False,
        model: torch.nn.Module | None = None,
    ) -> None:
        w = config.workload
        self.device = device
        self.blas = select_blas(config.mode.blas, device)  # eager steps' GEMMs
        # the decode graphs' GEMMs: the library is fixed when a graph is captured
        self.graph_blas = config.mode.graph_blas if device.type == "cuda" else "none"
        self.upload_graphs = config.engine.upload_graphs  # each graph launched once at capture
        rewrite = device.type == "cuda" and config.engine.graph_memsets == "kernels"
        self.memsets = MemsetRewriter() if rewrite else None  # memset nodes as fill kernels
        self.split_argmax = device.type == "cuda" and config.mode.split_argmax
        self.model = runtime_model(config, device, model)
        self.shape = model_shape(self.model)
        s = self.shape
        dtype = DTYPES[config.model.dtype] if not config.model.path else self.model.dtype
        self.cache = PagedKVCache(
            s["num_layers"],
            num_kv_blocks,
            w.kv_block_size,
            s["num_kv_heads"],
            s["head_dim"],
            dtype,
            device,
        )
        built = device.type == "cuda" and model is None  # a model passed in is used as it is
        mode = config.mode
        self.fused = {
            "projections": built and mode.fuse_projections,
            "norm_rope": built and mode.fuse_norm_rope,
            "epilogues": built and mode.fuse_epilogues,
            "rope_kv": built and mode.rope_in_kv_write(),
        }
        self.cache.fused = self.fused["epilogues"]
        self.launch_rule = LaunchRule.of(config.engine.decode_launch)
        self.decode_kernel = load_decode_kernel(config.mode.attention, device, self.launch_rule)
        self.block_size = w.kv_block_size
        # graph buckets: the configured sizes up to the first that holds a full batch
        sizes = sorted(set(config.engine.graph_batch_sizes))
        cut = bisect.bisect_left(sizes, w.batch_size)
        # emulate_graphs (tests on a CPU): bucketed, padded decode steps run the graph's body eagerly
        on = graphs and (device.type == "cuda" or emulate_graphs)
        self.buckets = sizes[: cut + 1] if on else []
        biggest = max(self.buckets, default=0)
        self.max_outputs = max(w.batch_size, biggest)
        # graph layouts use the widest block table any request can need
        self.graph_width = max(1, -(-max_context // self.block_size))
        self.carry_len = self.max_outputs if carry_over else 0
        # a step with prompt tokens runs over its tokens padded to this (cbsim.costs.eager_tokens)
        self.token_multiple = config.engine.eager_token_multiple
        self.max_tokens = round_up(w.max_batch_tokens, self.token_multiple)
        # short continuations attend as decode rows, a row per token (attention_groups)
        self.short_max = config.engine.continuation_decode_max
        self.max_decode_rows = max_decode_rows(self.max_outputs, self.max_tokens, self.short_max)
        cap = slot_capacity(max(self.max_tokens, biggest), self.max_decode_rows, self.graph_width)
        # steps with prompt tokens replayed per token bucket (engine.mixed_graphs)
        tokens = buckets_of(config) if on else []
        full = mixed_graphs_mode(config) == "full"
        if tokens and full:
            block_q = tokens_per_tile(s["num_heads"], s["num_kv_heads"])
            cap = max(cap, FullGraphs.entries(self, tokens, block_q))
        self.slots = [IOSlot(i, cap, self.max_outputs, device) for i in range(num_slots)]
        self.graph_widths = {
            b: self._launch_classes(b) if config.engine.graph_width_classes else [self.graph_width]
            for b in self.buckets
        }
        self.graphs: dict[tuple[int, int, int], torch.cuda.CUDAGraph] = {}
        self.graph_layouts = {
            b: empty_decode_layout(b, self.graph_width, self.carry_len) for b in self.buckets
        }
        self.pool = None
        self.memory = {
            "kv_cache_bytes": self.cache.nbytes,
            "io_buffer_bytes": sum(sl.nbytes for sl in self.slots),
            "io_slot_bytes": self.slots[0].nbytes,
            "graph_pool_bytes": 0,
            "graph_pool_bytes_single_slot": 0,
        }
        self._no_logits = torch.empty(0, dtype=torch.int64, device=device)
        kind = FullGraphs if full else MixedGraphs
        self.mixed = kind(self, tokens) if tokens else None
        self.memory.update(
            mixed_graphs=0,
            mixed_graph_steps=0,
            mixed_pool_bytes=0,
            mixed_attn_buffer_bytes=self.mixed.out_bytes if self.mixed else 0,
        )

    def _launch_classes(self, rows: int) -> list[int]:
        """The table widths to capture a graph of ``rows`` requests at: one per launch class of
        the Triton decode kernel; the one width when another kernel runs the decode rows."""
        if self.decode_kernel is None:
            return [self.graph_width]
        kv_heads = self.shape["num_kv_heads"]
        return launch_classes(self.launch_rule, rows, kv_heads, self.graph_width, self.block_size)

    # ------------------------------------------------------------------ host side

    def prev_out(self, slot: IOSlot) -> torch.Tensor:
        """The other slot's output buffer: batch N+1 reads batch N's sampled tokens from it."""
        return self.slots[(slot.index + 1) % len(self.slots)].dev_out

    def plan(self, batch, slot: IOSlot, carry: np.ndarray | None) -> StepPlan:
        """Pack the batch into the slot's pinned buffer (the host's "prepare" phase)."""
        bucket = None
        if self.buckets and batch.query_tokens == len(batch) and len(batch) <= self.buckets[-1]:
            bucket = self.buckets[bisect.bisect_left(self.buckets, len(batch))]
        if bucket is not None:
            layout, slot.written = pack_decode_into(
                slot.host_np,
                batch,
                self.graph_layouts[bucket],
                self.cache.scratch_block,
                carry,
                slot.written,
            )
            width = class_width(self.graph_widths[bucket], int(batch.num_blocks.max()))
            return StepPlan(batch, slot, layout, bucket, layout.total, width, pieces=1)
        mixed = self.mixed
        tokens = bucket_of(mixed.buckets, batch.query_tokens) if mixed else None
        if tokens is not None and batch.query_tokens > len(batch):
            flat, layout = mixed.pack(batch, carry, tokens)
            slot.write(flat)
            return StepPlan(batch, slot, layout, None, flat.size, None, tokens, mixed.pieces)
        flat, layout = pack(
            batch,
            self.cache.scratch_block,
            carry,
            self.carry_len,
            token_multiple=self.token_multiple,
            short_max=self.short_max,
        )
        slot.write(flat)
        return StepPlan(batch, slot, layout, bucket, flat.size)

    # ------------------------------------------------------------------ device side

    def copy_in(self, plan: StepPlan) -> None:
        dev, host = plan.slot.input_views(plan.num_entries)
        dev.copy_(host, non_blocking=True)

    def copy_out(self, plan: StepPlan) -> None:
        # a graph step brings its whole bucket back: fixed views, a few bytes more
        n = plan.bucket if plan.bucket is not None else plan.layout.num_sample
        host, dev = plan.slot.output_views(n)
        host.copy_(dev, non_blocking=True)

    def tokens(self, plan: StepPlan) -> np.ndarray:
        return plan.slot.host_out_np[: plan.layout.num_sample]

    def compute(self, plan: StepPlan) -> None:
        """Replay the slot's graph for the bucket, or run the step eagerly."""
        if plan.tokens_bucket is not None:
            self.mixed.run(plan.slot, plan.layout, plan.tokens_bucket)
        elif plan.bucket is not None:
            graph = self.graphs.get((plan.slot.index, plan.bucket, plan.width))
            if graph is not None:
                graph.replay()
            else:
                self.step_body(plan.slot, self.graph_layouts[plan.bucket], plan.width)
        else:
            self.step_body(plan.slot, plan.layout)

    @torch.inference_mode()
    def step_body(self, slot: IOSlot, layout: Layout, width: int | None = None) -> None:
        """``width``: the decode rows' block-table columns the attention kernel sees (a graph
        step's launch class; the layout holds the run's widest table)."""
        v = layout.views(slot.dev_in)
        if width is not None:
            v["dec_bt"] = v["dec_bt"][:, :width]
        self.carry_in(slot, v)
        self.forward(slot, v, self.attn_meta(v, layout))

    def carry_in(self, slot: IOSlot, v: dict) -> None:
        """Token carry-over: placeholders (0) += the previous batch's sampled tokens."""
        carry = v["carry"]
        if carry is not None:
            ids = v["input_ids"]
            prev = self.prev_out(slot)[: carry.numel()]
            ids.scatter_add_(0, carry.clamp(min=0), torch.where(carry >= 0, prev, 0))

    def attn_meta(self, v: dict, layout: Layout, **extra) -> AttnMeta:
        """The step's attention metadata over the slot's views, its shared indices derived."""
        meta = AttnMeta(
            cache=self.cache,
            num_tokens=layout.num_tokens,
            slot_mapping=v["slots"],
            all_decode=layout.all_decode,
            pre_qmax=layout.pre_qmax,
            ext_qmax=layout.ext_qmax,
            decode_kernel=self.decode_kernel,
            **{name: v.get(name) for name in META_SECTIONS},
            **extra,
        )
        meta.derive()
        return meta

    def forward(self, slot: IOSlot, v: dict, meta: AttnMeta) -> None:
        """The model over the step's rows, greedy tokens of the sampled rows into the slot."""
        keep = v["logits_idx"] if v["logits_idx"] is not None else self._no_logits
        logits = self.model(
            input_ids=v["input_ids"][None],
            position_ids=v["positions"][None],
            logits_to_keep=keep,
            cbsim_meta=meta,
            use_cache=False,
        ).logits[0]
        if logits.shape[0]:
            argmax_rows(logits, slot.dev_out[: logits.shape[0]], self.split_argmax)

    def capture_graphs(self, stream: torch.cuda.Stream) -> None:
        """Warm each (bucket, width) up eagerly, then capture every (slot, bucket, width) into one
        shared pool, largest first, their GEMMs on ``mode.graph_blas``; records the pool's bytes
        after the first slot and after all. Then the piecewise graphs (engine.mixed_graphs) on
        the same pool, their GEMMs on ``mode.blas``, and the bytes the pool grew by for them."""
        if not self.buckets:
            return
        select_blas(self.graph_blas, self.device)
        try:
            self._capture(stream)
        finally:
            select_blas(self.blas, self.device)
        if self.mixed is not None:
            before = self.memory["graph_pool_bytes"]
            self.mixed.capture(stream, self.pool)
            used, _ = self._pool_bytes(self._pool_base)
            self.memory.update(
                graph_pool_bytes=used,
                mixed_pool_bytes=used - before,
                mixed_graphs=self.mixed.num_graphs,
                mixed_graph_steps=len(self.mixed.sets),
            )

    def _capture(self, stream: torch.cuda.Stream) -> None:
        order = [(b, w) for b in sorted(self.buckets, reverse=True) for w in self.graph_widths[b]]
        with torch.cuda.stream(stream):
            for b, w in order:  # warm-up: Triton compiles, cuBLAS picks its kernels
                for slot in self.slots:
                    self._load_dummy(slot, b)
                    self.step_body(slot, self.graph_layouts[b], w)
        torch.cuda.synchronize()
        self.pool = torch.cuda.graph_pool_handle()
        torch.cuda.empty_cache()  # the baseline: no cached, unused blocks outside the pool
        base = self._pool_base = torch.cuda.memory_reserved(self.device)
        for slot in self.slots:
            for b, w in order:
                self._load_dummy(slot, b)
                g = capture_graph(
                    partial(self.step_body, slot, self.graph_layouts[b], w),
                    self.pool,
                    stream,
                    self.memsets,
                )
                self.graphs[(slot.index, b, w)] = g
                if self.upload_graphs:  # a graph's first launch uploads it: here, not in a step
                    g.replay()
            torch.cuda.synchronize()
            used, how = self._pool_bytes(base)
            if slot.index == 0:
                self.memory["graph_pool_bytes_single_slot"] = used
            self.memory["graph_pool_bytes"] = used
            self.memory["graph_pool_measure"] = how
        self.memory["graphs"] = len(self.graphs)

    def _pool_bytes(self, base: int) -> tuple[int, str]:
        """Bytes of the segments the allocator holds for the graphs' private pool (from its
        snapshot); else the growth of reserved memory over `base` after emptying the cache."""
        try:
            pool = tuple(self.pool)
            dev = (
                self.device.index if self.device.index is not None else torch.cuda.current_device()
            )
            segments = torch.cuda.memory_snapshot()
            if segments and "segment_pool_id" in segments[0]:
                total = sum(
                    s["total_size"]
                    for s in segments
                    if tuple(s["segment_pool_id"]) == pool and s.get("device", dev) == dev
                )
                return int(total), "allocator snapshot: segments of the graph pool"
        except Exception:  # the snapshot format is not a stable API
            pass
        torch.cuda.empty_cache()
        return torch.cuda.memory_reserved(self.device) - base, "reserved bytes growth"

    def _load_dummy(self, slot: IOSlot, bucket: int) -> None:
        layout = self.graph_layouts[bucket]
        flat = dummy_decode(layout, self.cache.scratch_block, self.block_size)
        slot.dev_in[: flat.size].copy_(torch.from_numpy(flat).to(self.device))
