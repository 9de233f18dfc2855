"""A forward's kernel time from a kernel table: the model's GEMMs, elementwise kernels and
attention, each looked up at the step's rows and contexts (kernel_table.py interpolates).

The kernels are the runtime's (runtime/profile_kernels.py times the same list): per layer the
projection GEMMs (q/k/v and gate/up fused when ``mode.fuse_projections``), two RMSNorms, RoPE, the
KV-cache write, SiLU x up and two residual adds (the adds inside the GEMMs, the write and SiLU x
up one kernel each, with ``mode.fuse_epilogues``); once per forward the final RMSNorm, the LM head
over the sampled rows and their argmax. Attention per layer: decode rows through the paged
decode kernel at their mean context, prompt chunks from position 0 as padded causal groups.
"""

from __future__ import annotations

import numpy as np

from cbsim.config.hardware import HardwareConfig
from cbsim.config.schema import CbsimConfig, ModelConfig
from cbsim.costs.kernel_table import KernelTable, load_table

# decode attention points and copies remembered per model: a fit re-costs the same steps hundreds
# of times, a validation simulates each run ten times (bounded, so a long simulation's contexts
# do not pile up)
MEMO_POINTS = 1 << 16
# mode.fuse_rope_kv's one kernel: RoPE of q and k, and the K/V cache write (kernel_table.py)
ROPE_KV = "rope_kv_write"
# models whose kernel costs are kept for the simulations after them (shared_kernel_costs)
SHARED_MODELS = 16


def gemm_shapes(m: ModelConfig, fused: bool) -> list[tuple[str, int, int]]:
    """(name, N, K) of every GEMM of one layer as the runtime runs it, then the LM head."""
    h, inter = m.hidden_size, m.intermediate_size
    q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    if fused:
        shapes = [("qkv", q + 2 * kv, h), ("o", h, q), ("gate_up", 2 * inter, h)]
    else:
        shapes = [("q", q, h), ("k", kv, h), ("v", kv, h), ("o", h, q)]
        shapes += [("gate", inter, h), ("up", inter, h)]
    return [*shapes, ("down", h, inter), ("lm_head", m.vocab_size, h)]


def elementwise_ops(
    m: ModelConfig, fused_epilogues: bool, rope_kv: bool = False, has=None
) -> list[tuple[str, int, int, int]]:
    """(op, n, k, calls per layer) of one layer's elementwise kernels: with ``mode.fuse_epilogues``
    the residual adds run inside the GEMMs, and the K/V write and SiLU x up are the one-kernel
    versions (their own table rows, ``*_fused``); with RoPE in the K/V write too
    (``mode.fuse_rope_kv``) the two are one kernel (``rope_kv_write``), or, for a table that
    lacks its row (``has``: the table's op check), the two kernels it replaced: an upper bound."""
    h, hq, hkv, d = m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim
    fused = "_fused" if fused_epilogues else ""
    rope = [("rope", (hq + hkv) * d, d, 1), ("kv_write" + fused, 2 * hkv * d, d, 1)]
    if fused_epilogues and rope_kv and (has is None or has(ROPE_KV)):
        rope = [(ROPE_KV, (hq + 2 * hkv) * d, d, 1)]
    ops = [("rms_norm", h, 0, 2), *rope, ("silu_mul" + fused, m.intermediate_size, 0, 1)]
    return ops if fused_epilogues else [*ops, ("add", h, 0, 2)]


class DecodeRows:
    """The contexts of a decode launch's rows as a kernel table is read at them: how many, their
    sum and longest, and their sum in whole tiles (once a tile)."""

    def __init__(self, ctx: np.ndarray) -> None:
        self.ctx = ctx
        self.n, self.total, self.top = len(ctx), int(ctx.sum()), int(ctx.max())
        self._tiled: dict[int, int] = {}
        self._longest: DecodeRows | None = None

    def tiled(self, tile: int) -> int:
        got = self._tiled.get(tile)
        if got is None:
            got = self._tiled[tile] = int((-(-self.ctx // tile)).sum()) * tile
        return got

    def longest(self) -> DecodeRows:
        """As many rows, each at the longest one's context."""
        if self._longest is None:
            self._longest = DecodeRows(np.full(self.n, self.top))
        return self._longest


class KernelCosts:
    """One model's forward terms from a table, at the profile's rates for unseen shapes."""

    def __init__(self, config: CbsimConfig) -> None:
        hw: HardwareConfig = config.hardware
        m = config.model
        self.table: KernelTable = load_table(hw.kernel_table)
        self.rates = {"flops_per_us": hw.peak_flops * 1e-6, "bytes_per_us": hw.hbm_bandwidth * 1e-6}
        shapes = gemm_shapes(m, config.mode.fuse_projections)
        self.layer_gemms = [(n, k) for _, n, k in shapes[:-1]]
        self.lm_head = shapes[-1][1:]
        self.elementwise = [
            (op if self.table.has(op) else op.removesuffix("_fused"), n, k, c)
            for op, n, k, c in elementwise_ops(
                m, config.mode.fuse_epilogues, config.mode.rope_in_kv_write(), self.table.has
            )
        ]  # a table profiled before the fused kernels existed: their unfused rows, an upper bound
        self.layers, self.hidden, self.vocab = m.num_layers, m.hidden_size, m.vocab_size
        self.attn_shape = (m.num_heads, m.head_dim, m.num_kv_heads)
        # one layer's KV bytes per token of every request's tile, and where the share halves
        self.kv_bytes_per_token = 2 * m.num_kv_heads * m.head_dim * m.dtype_bytes
        self.tile_share_bytes = hw.gpu.attention_tile_share_bytes
        self.has_copies = self.table.has("h2d") and self.table.has("d2h")
        # decode attention timed per launch: a step is costed at the launch it runs
        self.per_launch = self.table.has_launches("decode_attention")
        # the GEMMs' rows per library: eager steps on mode.blas, decode graphs on mode.graph_blas
        mode = config.mode
        self.gemm_launch = {
            False: self.table.gemm_launch(mode.blas),
            True: self.table.gemm_launch(mode.graph_blas),
        }
        split = mode.split_argmax and self.table.has("argmax_split")
        self.argmax = "argmax_split" if split else "argmax"
        self._linear: dict[tuple[int, bool], float] = {}
        self._lm_head: dict[tuple[int, bool], float] = {}
        self._decode: dict[tuple[int, float, str], float] = {}
        self._copy: dict[tuple[str, int], float] = {}

    def t(
        self, op: str, n: int, k: int, g: int, rows: float, context: float = 0, launch: str = ""
    ) -> float:
        return self.table.time_us(op, n, k, g, rows, context, launch=launch, **self.rates)

    def linear_us(self, rows: int, graph: bool = False) -> float:
        """Every layer's GEMMs and elementwise kernels over ``rows`` tokens, and the final norm;
        ``graph``: a replayed decode graph's (its GEMMs on ``mode.graph_blas``)."""
        got = self._linear.get((rows, graph))
        if got is None:
            lib = self.gemm_launch[graph]
            per_layer = sum(self.t("gemm", n, k, 0, rows, 0, lib) for n, k in self.layer_gemms)
            per_layer += sum(c * self.t(op, n, k, 0, rows) for op, n, k, c in self.elementwise)
            got = self._linear[(rows, graph)] = self.layers * per_layer + self.t(
                "rms_norm", self.hidden, 0, 0, rows
            )
        return got

    def copy_us(self, direction: str, nbytes: int) -> float:
        """A pinned copy of ``nbytes`` (``h2d`` or ``d2h``), at least the smallest one timed."""
        key = (direction, nbytes)
        got = self._copy.get(key)
        if got is None:
            if len(self._copy) >= MEMO_POINTS:
                self._copy.clear()
            got = self._copy[key] = self.table.time_us(direction, 0, 0, 0, max(int(nbytes), 1))
        return got

    def lm_head_us(self, sampled: int, graph: bool = False) -> float:
        got = self._lm_head.get((sampled, graph))
        if got is None:
            n, k = self.lm_head
            got = self._lm_head[(sampled, graph)] = (
                self.t("gemm", n, k, 0, sampled, 0, self.gemm_launch[graph])
                + self.t(self.argmax, self.vocab, 0, 0, sampled)
                if sampled > 0
                else 0.0
            )
        return got

    def decode_attention_us(self, rows: int, mean_context: float, launch: str = "") -> float:
        """All layers' decode attention at ``launch``. A split launch's rows start at a context
        of one partition (profile_kernels.decode_launches); below it the requests fit in fewer
        partitions than the table has: the one-partition kernel over their context plus what
        the split added where it was first timed (the empty partitions exit, the reduce runs)."""
        key = (rows, mean_context, launch)
        got = self._decode.get(key)
        if got is None:
            if len(self._decode) >= MEMO_POINTS:
                self._decode.clear()
            got = self._decode[key] = self._decode_attention_us(rows, mean_context, launch)
        return got

    def _decode_attention_us(self, rows: int, mean_context: float, launch: str) -> float:
        at = self.attn_shape
        tile, _, part = launch.partition("p")
        if not (part and self.per_launch and mean_context < int(part)):
            return self.layers * self.t("decode_attention", *at, rows, mean_context, launch)
        first = int(part)
        extra = self.t("decode_attention", *at, rows, first, launch) - self.t(
            "decode_attention", *at, rows, first, tile
        )
        one = self.t("decode_attention", *at, rows, mean_context, tile)
        return self.layers * (one + max(extra, 0.0))

    def tile_share(self, rows: int, tile: int, share: float) -> float:
        """The share of the decode kernel's time that grows per whole tile at ``rows`` requests:
        ``share`` for a latency-bound batch, falling as the tile's KV bytes over the batch grow
        (the H200's kernel probes: 0.66 at 1 request, 0.33 at 256 of the 8B shape)."""
        if not self.tile_share_bytes:
            return share
        return share / (1.0 + rows * self.kv_bytes_per_token * tile / self.tile_share_bytes)

    def decode_rows_us(
        self, rows: DecodeRows, tile: int, tile_share: float, launch: str = "", uneven: float = 0.0
    ) -> float:
        """The paged decode kernel over requests of contexts ``rows`` (``even_rows_us``); a
        launch that ends with its longest request pays ``uneven`` of the way from the even batch
        of their mean context to one of the longest's (hardware.gpu.decode_uneven_share)."""
        even = self.even_rows_us(rows, tile, tile_share, launch)
        if not uneven or rows.top * rows.n == rows.total:
            return even
        longest = self.even_rows_us(rows.longest(), tile, tile_share, launch)
        return even + uneven * (longest - even)

    def even_rows_us(self, rows: DecodeRows, tile: int, tile_share: float, launch: str) -> float:
        """The kernel's time as the table has it at the batch's mean context: it reads live
        tokens only but computes whole tiles of ``tile`` tokens, so a share of its time
        (``tile_share``) is charged at each context rounded up to its tile (the table's contexts
        are tile multiples, where the two agree; between them it is interpolated per token)."""
        n, total = rows.n, rows.total
        per_token = self.decode_attention_us(n, total / n, launch)
        if not tile_share:
            return per_token
        tile_share = self.tile_share(n, tile, tile_share)
        tiled = rows.tiled(tile)
        if tiled == total:
            return per_token
        return (1.0 - tile_share) * per_token + tile_share * self.decode_attention_us(
            n, tiled / n, launch
        )

    def prefill_attention_us(self, prompts: int, length: int) -> float:
        return self.layers * self.t("prefill_attention", *self.attn_shape, prompts, length)

    def attention_us(
        self,
        batch,
        rows: DecodeRows | None,
        padded_groups: bool,
        tile: int = 128,
        tile_share: float = 0.0,
        launch: str = "",
        groups=None,
        uneven: float = 0.0,
    ) -> float:
        """Decode rows (``decode_rows_us`` over ``rows``, the contexts of a decode step's
        requests or of a mixed step's decode rows, short continuations among them) and, with
        ``groups`` (a mixed step's), prompt chunks from position 0 (chunks after a cached prefix
        beyond the decode rows are costed by the caller's roofline)."""
        total = 0.0
        if rows is not None:
            total += self.decode_rows_us(rows, tile, tile_share, launch, uneven)
        if groups is None:
            return total
        fresh = groups.fresh
        if len(fresh):
            q = batch.query_lens
            if padded_groups:  # one group padded to its longest chunk
                total += self.prefill_attention_us(len(fresh), int(q[fresh].max()))
            else:
                total += sum(self.prefill_attention_us(1, int(n)) for n in np.asarray(q[fresh]))
        return total


_SHARED: dict[tuple, KernelCosts] = {}


def shared_kernel_costs(config: CbsimConfig) -> KernelCosts:
    """``KernelCosts(config)``, kept for every later config that reads the same table, rates,
    model shapes and kernel modes: its lookups are pure, so the simulations of one run (a band's
    draws move only host costs and the forward's scale) and of runs of one model share them."""
    key = _kernel_key(config)
    got = _SHARED.get(key)
    if got is None:
        if len(_SHARED) >= SHARED_MODELS:
            _SHARED.clear()
        got = _SHARED[key] = KernelCosts(config)
    return got


def _kernel_key(config: CbsimConfig) -> tuple:
    """Everything ``KernelCosts.__init__`` reads of a config; the table by identity (load_table
    reloads a changed file, and a kept KernelCosts holds its table, so no other takes its id)."""
    hw, m, mode = config.hardware, config.model, config.mode
    table = load_table(hw.kernel_table)
    shape = (m.num_layers, m.hidden_size, m.intermediate_size, m.vocab_size, m.num_heads)
    shape += (m.head_dim, m.num_kv_heads, m.dtype_bytes)
    modes = (mode.fuse_projections, mode.fuse_epilogues, mode.blas, mode.graph_blas)
    modes += (mode.split_argmax,)
    rates = (hw.peak_flops, hw.hbm_bandwidth, hw.gpu.attention_tile_share_bytes)
    return (id(table), rates, shape, modes)
