"""CostModel: the roofline forward, copies, host phases and memory (microseconds, bytes).

Every term is a config value (``hardware``, ``model``, ``workload``; hardware.py says where each
came from), so a what-if is an override. The forward, a roofline per operation kind (max(FLOPs /
achieved FLOP/s, bytes / achieved bandwidth), achieved = peak x that kind's efficiency):

- linear layers: the GEMMs (FLOPs 2 x params x query tokens; weights read once, plus
  ``gemm_row_us`` per computed row, padded graph rows included) and, added, the activations'
  elementwise traffic at the same bandwidth; the LM head over the sampled rows only;
- attention: the KV each request reads (padded to ``attention_kv_pad``) plus the new K/V; FLOPs
  4 x heads x head_dim x layers x sum(q x mean context); decode adds ``attention_walk_us_per_token``
  x min(longest decode context, the split-K partition of ``engine.decode_launch``);
- ``forward_fixed_us``, one gap per kernel (eager or graph node; ``step_kernels`` counts them by
  the step's attention groups), ``carry_over_us``; ``idle_slowdown`` x the stream's idle before.
  A replay of a step with prompt tokens (``padded_tokens``, mixed_graphs.py): the linear layers
  over its token bucket, attention over its real rows; piecewise, eager gaps for attention.

With ``hardware.kernel_table`` the GEMMs, elementwise kernels, decode attention (its
``attention_tile_share`` per whole KV tile) and prompt starts, and the copies are measured times
(kernels.py); continuations keep the roofline plus ``prefix_walk_us_per_element`` x their widest
table x head_dim x layers. Copies: ``copy_latency_us + bytes / bandwidth``. Host phases
(host_phase_costs.py): ``PhaseCost`` over requests, tokens and KV blocks (``kv_tokens //
block_size + requests``); a launch: one ``kernel_launch_us`` per kernel or one
``graph_launch_us`` (a piecewise replay: one a piece, plus its attention kernels' launches,
sim/launch.py), ``launch_per_block_us`` per block, ``copy_launch_us`` per copy, ``event_us`` per
event op.
"""

from __future__ import annotations

import numpy as np

from cbsim.config.schema import CbsimConfig
from cbsim.costs.buffer_bytes import BufferBytes
from cbsim.costs.clock import settle_forward
from cbsim.costs.decode_kernel import GraphTables, LaunchRule
from cbsim.costs.eager_tokens import eager_tokens
from cbsim.costs.forward_cost import ForwardCost, roofline_us
from cbsim.costs.host_jitter import HostJitter
from cbsim.costs.host_phase_costs import HostPhaseCosts
from cbsim.costs.kernel_count import layer_kernels, step_kernels
from cbsim.costs.kernels import shared_kernel_costs
from cbsim.costs.mixed_graphs import bucket_of, buckets_of, mixed_graphs_mode, piecewise
from cbsim.costs.shared_steps import decode_terms, remember
from cbsim.costs.step_tables import StepMemo, StepTables


class CostModel(BufferBytes, HostPhaseCosts, StepTables):
    """Durations for one configuration; precomputes the per-model constants once."""

    def __init__(
        self,
        config: CbsimConfig,
        max_context: int | None = None,
        like: CostModel | None = None,
        share_steps: bool = False,
    ) -> None:
        """``max_context``: the longest request (prompt + new tokens), which sets the block
        table's width; None: from the workload. ``like``: a CostModel of the same run under
        other GPU terms (a fit's), whose kernel lookups and per-step shapes hold here too.
        ``share_steps`` (a simulation's): decode steps' kernel-table terms kept for every
        simulation of this configuration (shared_steps.py)."""
        m, hw, w = config.model, config.hardware, config.workload
        self.hw, self.gpu, self.host = hw, hw.gpu, hw.host
        self.block_size = w.kv_block_size
        dt = m.dtype_bytes
        h, kv, inter, layers = (
            m.hidden_size,
            m.num_kv_heads * m.head_dim,
            m.intermediate_size,
            m.num_layers,
        )
        self.layers = layers
        # linear weights read once per pass; the embedding table is a gather (one row per token)
        self.linear_weight_bytes = layers * m.layer_params * dt + h * dt
        self.linear_flops_per_token = 2.0 * layers * m.layer_params
        # activations per token per layer, read + written: residual and norms (4h), q/k/v (h+2kv),
        # attention out and o-proj out (2h), gate/up (2i), act (i), down (h)
        self.act_bytes_per_token = 2 * layers * dt * (8 * h + 2 * kv + 3 * inter) + h * dt
        self.lm_head_bytes = m.vocab_size * h * dt
        self.lm_head_flops_per_row = 2.0 * m.vocab_size * h
        self.logits_bytes_per_row = m.vocab_size * 4  # fp32 logits for sampling
        self.kv_bytes_per_token = m.kv_bytes_per_token
        self.attn_flops_coeff = 4.0 * m.num_heads * m.head_dim * layers
        mode = config.mode
        self.kernels = (
            layer_kernels(self.gpu, mode.fuse_epilogues, mode.rope_in_kv_write()) * layers
        )
        self.kernels += self.gpu.kernels_extra
        # achieved rates, per microsecond
        g = self.gpu
        self.gemm_flops = hw.peak_flops * g.gemm_flops_eff * 1e-6
        self.gemm_bw = hw.hbm_bandwidth * g.gemm_bandwidth_eff * 1e-6
        self.attn_flops = hw.peak_flops * g.attention_flops_eff * 1e-6
        self.peak_per_us = hw.peak_flops * 1e-6
        self.attn_bw = hw.hbm_bandwidth * g.attention_bandwidth_eff * 1e-6
        self.h2d_bw = hw.h2d_bandwidth * 1e-6
        self.d2h_bw = hw.d2h_bandwidth * 1e-6
        self.graph_sizes = sorted(config.engine.graph_batch_sizes)
        self.token_multiple = config.engine.eager_token_multiple
        self.token_buckets = buckets_of(config)  # [] with engine.mixed_graphs=off
        self.piecewise = mixed_graphs_mode(config) == "buckets"
        self.upload_graphs = config.engine.upload_graphs  # first launches paid at capture
        self.short_max = config.engine.continuation_decode_max
        self.model, self.workload = m, w
        self.gemm_row_us = g.gemm_row_us
        self.walk_us = g.attention_walk_us_per_token
        self.idle_slowdown = g.idle_slowdown
        self.kv_heads = m.num_kv_heads
        # what one program of the continuation kernel walks per table token, all layers
        self.walk_elements_per_token = layers * m.head_dim
        self._max_context = max_context
        if like is not None:
            self.rule, self.graph_tables, self.memo = like.rule, like.graph_tables, like.memo
            self._partitions = like._partitions
            if max_context is None:
                self._max_context = like._max_context
        else:
            # a graph per decode-kernel launch class (engine.graph_width_classes; the Triton kernel)
            classes = config.engine.graph_width_classes and config.mode.attention != "torch"
            self.rule = LaunchRule.of(config.engine.decode_launch)
            self.graph_tables = GraphTables(self.rule, self.kv_heads, self.block_size, classes)
            self.memo, self._partitions = StepMemo(), {}
        # step-to-step host speed, only in a band's draws (host_jitter.py)
        sp = hw.host.spread
        self.jitter = HostJitter(sp.within_run, sp.seed) if sp.jitter and sp.within_run else None
        # measured kernel times in place of the roofline's GEMMs and attention (kernels.py)
        kernel_costs = like.kernel_costs if like is not None else None
        if kernel_costs is None and hw.kernel_table:
            kernel_costs = shared_kernel_costs(config)
        self.kernel_costs = kernel_costs
        # pinned copies from the table too, when it timed them
        self.table_copies = self.kernel_costs is not None and self.kernel_costs.has_copies
        self.decode_terms = None
        if share_steps and like is None and kernel_costs is not None:
            self.decode_terms = decode_terms(config, kernel_costs, self.max_context)

    def idle_slowdown_us(self, idle_us: float) -> float:
        """Extra time of a forward whose compute stream sat idle ``idle_us`` before it."""
        return self.idle_slowdown * idle_us if idle_us > 0 else 0.0

    def kv_blocks(self, kv_tokens: int, requests: int) -> int:
        """Block-table entries of a batch: sum of ceil(context / block) is at most this."""
        return kv_tokens // self.block_size + requests

    # ---- GPU -------------------------------------------------------------------------------
    def graph_size(self, requests: int) -> int | None:
        """The captured batch size a decode batch of ``requests`` is padded to (None: eager)."""
        for size in self.graph_sizes:
            if size >= requests:
                return size
        return None

    def graph_padding(self, batch) -> tuple[int | None, int | None]:
        """What a graph replaying ``batch`` computes: a decode graph's padded requests (one query
        token each, the prompt's last among them) or a step's token bucket (engine.mixed_graphs);
        (None, None): no graph holds it. The simulator's launch and the forward fit both ask."""
        if batch.query_tokens == len(batch):
            return self.graph_size(len(batch)), None
        return None, bucket_of(self.token_buckets, batch.query_tokens)

    def forward(
        self,
        batch,
        *,
        graph: bool,
        carry_over: bool,
        padded_requests: int | None = None,
        padded_tokens: int | None = None,
    ) -> ForwardCost:
        """One forward pass over a scheduler Batch (``query_lens``, ``context_lens``,
        ``query_tokens``, ``kv_tokens``, ``num_samples``, ``kind``); ``padded_tokens``: a
        replay over that token bucket, piecewise or one full graph (mixed_graphs.py)."""
        q_tokens, sampled = batch.query_tokens, batch.num_samples
        graph_blas = graph and not padded_tokens  # pieces keep the eager steps' library
        decode = batch.kind == "decode"  # one query token per request: closed forms below
        if padded_requests is not None and padded_requests > len(batch):
            # a replayed decode graph computes its padded rows too (one token each, no KV)
            extra = padded_requests - len(batch)
            q_tokens += extra
            sampled += extra
        elif not graph_blas:  # a step with prompt tokens runs over its padded rows
            q_tokens = padded_tokens or eager_tokens(batch, self.token_multiple)
        if self.kernel_costs is None:
            linear, lm_head = self._roofline_linear(q_tokens, sampled)
            attention = self._roofline_attention(batch, decode, padded_requests)
        elif decode and self.decode_terms is not None:  # kept across this config's runs
            ctx = np.asarray(batch.context_lens)
            key = (ctx.tobytes(), ctx.dtype.str, q_tokens, sampled, graph_blas, padded_requests)
            terms = self.decode_terms.get(key)
            if terms is None:
                terms = self._table_terms(
                    batch, True, q_tokens, sampled, graph_blas, padded_requests
                )
                remember(self.decode_terms, key, terms)
            linear, lm_head, attention = terms
        else:
            linear, lm_head, attention = self._table_terms(
                batch, decode, q_tokens, sampled, graph_blas, padded_requests
            )
        cost = self._cost(batch, decode, graph, carry_over, linear, lm_head, attention)
        if padded_tokens and self.piecewise:  # its pieces, and attention launched between them
            piecewise(cost, self.gpu, self.layers, self.groups(batch))
        if self.gpu.clock.throttles:
            gemm, head = (
                self.linear_flops_per_token * q_tokens,
                self.lm_head_flops_per_row * sampled,
            )
            settle_forward(cost, self.gpu.clock, gemm, head, self.peak_per_us)
        return cost

    def _table_terms(
        self,
        batch,
        decode: bool,
        q_tokens: int,
        sampled: int,
        graph_blas: bool,
        padded_requests: int | None,
    ) -> tuple[float, float, float]:
        """The layers', LM head's and attention's time from the kernel table; chunks after a
        cached prefix (not timed) by the roofline."""
        kc = self.kernel_costs
        linear, lm_head = kc.linear_us(q_tokens, graph_blas), kc.lm_head_us(sampled, graph_blas)
        share = self.gpu.attention_tile_share
        tile = self.decode_tile(batch, padded_requests) if share else 128
        launch = self.decode_launch(batch, padded_requests) if kc.per_launch else ""
        groups = None if decode else self.groups(batch)
        rows = self.decode_rows(batch, decode)
        uneven = self.uneven_share(batch, padded_requests)
        padded_groups = self.gpu.attention_padded_groups
        attention = kc.attention_us(batch, rows, padded_groups, tile, share, launch, groups, uneven)
        s = self.gpu.kernel_table_scale  # the table's machine against the one costed
        linear, lm_head, attention = linear * s, lm_head * s, attention * s
        attention += 0.0 if decode else self.continuation_attention_us(batch)
        return linear, lm_head, attention

    def forward_gemm_flops(self, q_tokens: int, sampled: int) -> float:
        """The FLOPs of a forward's GEMMs: the layers' over every computed row, the LM head's
        over the sampled ones."""
        return self.linear_flops_per_token * q_tokens + self.lm_head_flops_per_row * sampled

    def _roofline_linear(self, q_tokens: int, sampled: int) -> tuple[float, float]:
        """The linear layers and the LM head over ``q_tokens`` computed and ``sampled`` rows."""
        # the GEMMs: a roofline of their FLOPs and their weights; the activations' reads and
        # writes (norms, RoPE, SiLU, residual adds) are kernels of their own, memory-bound,
        # added (in a prefill their max with the FLOPs hid 33 ms at 8K tokens, the H200's recordings)
        linear = (
            max(
                self.linear_flops_per_token * q_tokens / self.gemm_flops,
                self.linear_weight_bytes / self.gemm_bw + self.gemm_row_us * q_tokens,
            )
            + self.act_bytes_per_token * q_tokens / self.gemm_bw
        )
        lm_head = 0.0
        if sampled:
            lm_head = roofline_us(
                self.lm_head_flops_per_row * sampled,
                self.lm_head_bytes + self.logits_bytes_per_row * sampled,
                self.gemm_flops,
                self.gemm_bw,
            )
        return linear, lm_head

    def _roofline_attention(self, batch, decode: bool, padded_requests: int | None) -> float:
        kv_tokens = batch.kv_tokens
        pad = self.gpu.attention_kv_pad
        ctx = batch.context_lens
        read_tokens = int((((ctx + pad - 1) // pad) * pad).sum()) if pad > 1 else kv_tokens
        if decode:
            attn_work = float(kv_tokens)
        elif self.gpu.attention_padded_groups:
            attn_work = self.padded_attention_work(batch)
        else:
            # causal: query token j of a chunk sees start + j + 1 keys; mean over the chunk
            q = batch.query_lens
            attn_work = float((q * (ctx - (q - 1) * 0.5)).sum())
        attention = roofline_us(
            self.attn_flops_coeff * attn_work,
            (read_tokens + batch.query_tokens) * self.kv_bytes_per_token,
            self.attn_flops,
            self.attn_bw,
        )
        if self.walk_us:
            if decode:
                rows = padded_requests if padded_requests is not None else len(batch)
                longest = int(ctx.max())
            else:  # the decode rows of a mixed step go through the same kernel
                dec_ctx = self.groups(batch).dec_ctx
                rows = len(dec_ctx)
                longest = int(dec_ctx.max()) if rows else 0
            if rows:
                width = self.graph_table(rows, longest) if padded_requests is not None else None
                attention += self.walk_us * min(longest, self.partition(rows, width))
        if not decode:
            attention += self.prefix_walk_us(batch)
        return attention

    def _cost(self, batch, decode, graph, carry_over, linear, lm_head, attention) -> ForwardCost:
        gap = self.gpu.graph_node_gap_us if graph else self.gpu.eager_kernel_gap_us
        kernels = self.step_kernels(batch, decode) + (1 if carry_over else 0)
        cost = ForwardCost(
            linear_us=linear,
            lm_head_us=lm_head,
            attention_us=attention,
            overhead_us=self.gpu.forward_fixed_us + gap * kernels,
            carry_over_us=self.gpu.carry_over_us if carry_over else 0.0,
            kernels=kernels,
        )
        scale = self.gpu.spread.forward_scale
        if scale != 1.0:  # a band's draw of the forward model's error
            cost.linear_us *= scale
            cost.lm_head_us *= scale
            cost.attention_us *= scale
            cost.overhead_us *= scale
            cost.carry_over_us *= scale
        return cost

    def prefix_walk_us(self, batch) -> float:
        """The masked continuation kernel's walk over the widest continuation's table: its kv
        heads' programs run side by side, each over table tokens x head_dim, layer after layer."""
        ext = self.groups(batch).ext
        if not self.gpu.prefix_walk_us_per_element or not len(ext):
            return 0.0
        width = -(-int(batch.context_lens[ext].max()) // self.block_size) * self.block_size
        return self.gpu.prefix_walk_us_per_element * width * self.walk_elements_per_token

    def continuation_attention_us(self, batch) -> float:
        """Chunks after a cached prefix, which a kernel table does not time: the roofline of
        their work (padded to the longest, against the whole gathered table, as the runtime
        runs them with attention_padded_groups) and the walk over that table."""
        ext = self.groups(batch).ext
        if not len(ext):
            return 0.0
        q, ctx = batch.query_lens[ext], batch.context_lens[ext]
        if self.gpu.attention_padded_groups:
            width = -(-int(ctx.max()) // self.block_size) * self.block_size
            work, read = float(len(q) * int(q.max()) * width), len(q) * width
        else:
            work, read = float((q * (ctx - (q - 1) * 0.5)).sum()), int(ctx.sum())
        flops, nbytes = (
            self.attn_flops_coeff * work,
            (read + int(q.sum())) * self.kv_bytes_per_token,
        )
        return roofline_us(flops, nbytes, self.attn_flops, self.attn_bw) + self.prefix_walk_us(
            batch
        )

    def padded_attention_work(self, batch) -> float:
        """Query x key pairs the runtime's attention computes in a step with prompt chunks
        (runtime/attention.py): decode rows their context; prompt starts padded to the longest,
        causal (flash skips the masked half); continuations padded to the longest and masked
        against the whole gathered table (no causal skipping)."""
        q, ctx = batch.query_lens, batch.context_lens
        g = self.groups(batch)
        fresh, ext = g.fresh, g.ext
        work = float(g.dec_ctx.sum())
        if len(fresh):
            qm = int(q[fresh].max())
            work += len(fresh) * qm * (qm + 1) / 2
        if len(ext):
            qm = int(q[ext].max())
            width = -(-int(ctx[ext].max()) // self.block_size) * self.block_size
            work += len(ext) * qm * width
        return work

    def step_kernels(self, batch, decode: bool) -> int:
        """Kernels of one forward (graph nodes when replayed), by the step's attention groups
        (kernel_count.py)."""
        groups = None if decode else self.groups(batch)
        return step_kernels(self.gpu, self.kernels, self.layers, groups)

    def h2d_us(self, nbytes: int) -> float:
        if self.table_copies:
            return self.kernel_costs.copy_us("h2d", nbytes)
        return self.hw.copy_latency_us + nbytes / self.h2d_bw

    def d2h_us(self, nbytes: int) -> float:
        if self.table_copies:
            return self.kernel_costs.copy_us("d2h", nbytes)
        return self.hw.copy_latency_us + nbytes / self.d2h_bw
