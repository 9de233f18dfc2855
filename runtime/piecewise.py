"""Steps with prompt tokens replayed from piecewise CUDA graphs (engine.mixed_graphs=buckets).

What cbsim/costs/mixed_graphs.py models, as serving engines run it (vLLM's piecewise mode): the
forward is split at attention. Each piece between two attentions (o_proj, residual, norms, MLP,
the next layer's q/k/v and RoPE; the first piece also the carry-over scatter and the embedding;
the last the final norm, the LM head over the sampled rows and the argmax) is a CUDA graph
captured per (IO slot, token bucket) on the runner's shared pool; attention runs eagerly
between the pieces over the step's real rows, since how a step's tokens split into requests
is what a graph cannot fix.

Layout: a step is packed as an eager step padded to its bucket (`pack` with the bucket as the
token multiple: padding rows write only the scratch block and sit in no attention group), with
its sampled rows padded to the runner's ``max_outputs`` (`pad_logits`: pointing at the last
row). The sections the pieces read (ids, positions, KV slots, logits indices, carry-over) come
first in the buffer, so their offsets and shapes are fixed per bucket; the attention groups
after them vary step by step and only the eager attention reads them.

The split: the layers stay transformers' own (with whatever runtime_model fused), and the cut is
inside the attention call: ``AttnMeta.split`` receives each layer's call. Capturing, it ends the
current piece's graph, records the layer's q/k/v, runs attention eagerly and begins the next
piece's graph; replaying, `MixedGraphs.replay` replays piece 0, runs layer 0's attention from
the recorded q/k/v, replays piece 1, and so on. Attention writes into one buffer outside the
pool (`MixedGraphs.out`, each bucket's prefix of it), which the next piece reads.

Lifetimes: the recorded q/k/v live in the shared pool and are kept as unowned aliases
(`unowned`), so the pool can hand their memory to later allocations once the forward drops
them (kept alive, a bucket's q/k/v for every layer would stay allocated: gigabytes at 8B). That
is safe because a step replays its pieces in capture order on one stream: a piece writes its
q/k/v, the eager attention reads them next, and only later work may overwrite them. The eager
attention's own temporaries come from the ordinary allocator, outside the pool.
"""

from __future__ import annotations

import dataclasses
import gc
from dataclasses import dataclass, field

import numpy as np
import torch

from cbsim.config.errors import ConfigError
from cbsim.config.schema import CbsimConfig
from cbsim.costs.mixed_graphs import mixed_graphs_mode

from .attention import ATTN_NAME, AttnMeta, attend
from .io_slots import IOSlot, Layout, dummy_prefill, make_layout, pack


def check_mixed_graphs(config: CbsimConfig, device: torch.device, cpu_emulation: bool) -> None:
    """engine.mixed_graphs=buckets or full captures CUDA graphs: on a CPU it runs only in the
    tests' emulation of the capture and replay; full runs attention in the Triton kernels."""
    mg = config.engine.mixed_graphs
    if mg in ("off", "auto"):  # auto: what the device allows (resolve_mixed_graphs)
        return
    if device.type != "cuda" and not cpu_emulation:
        raise ConfigError(
            f"engine.mixed_graphs={mg} with mode.device={config.mode.device} runs only in the "
            "tests' CPU emulation (execute(..., cpu_emulation=True)); allowed with mode=runtime: off"
        )
    if mg == "full" and device.type == "cuda" and config.mode.attention == "torch":
        raise ConfigError(
            "engine.mixed_graphs=full runs attention in a Triton kernel inside the graph, and "
            "mode.attention=torch asks for none; allowed: mode.attention=triton or auto, or "
            "engine.mixed_graphs=buckets or off"
        )


def resolve_mixed_graphs(config: CbsimConfig, device: torch.device) -> CbsimConfig:
    """``config`` with engine.mixed_graphs=auto made what this device runs (mixed_graphs_mode,
    and off where the Triton kernels cannot load), so the runner and the trace see one value."""
    if config.engine.mixed_graphs != "auto":
        return config
    mode = mixed_graphs_mode(config) if device.type == "cuda" else "off"
    if mode == "full":
        try:
            from .kernels import varlen_attention  # noqa: F401  (Triton)
        except ImportError:
            mode = "off"
    engine = dataclasses.replace(config.engine, mixed_graphs=mode)
    return dataclasses.replace(config, engine=engine)


def unowned(t: torch.Tensor) -> torch.Tensor:
    """A tensor over ``t``'s memory (same offset, shape, strides) that does not keep it
    allocated: the caller guarantees the memory is read only while its writer's data is there
    (torch's cudagraph trees alias graph outputs the same way)."""
    st = t.untyped_storage()
    alias = torch._C._construct_storage_from_data_pointer(st.data_ptr(), t.device, st.nbytes())
    return t.new_empty(0).set_(alias, t.storage_offset(), t.shape, t.stride())


def pad_logits(flat: np.ndarray, layout: Layout, rows: int) -> tuple[np.ndarray, Layout]:
    """The step's logits indices padded to ``rows`` with its last token row, so the LM head
    and the argmax of a bucket's last piece always run over ``rows`` rows."""
    at = {name: (off, shape) for name, off, shape in layout.offsets}
    off, (n,) = at["logits_idx"]
    if n > rows:
        raise RuntimeError(f"{n} sampled rows exceed the piecewise graphs' {rows}")
    flat = np.insert(flat, off + n, np.full(rows - n, layout.num_tokens - 1, np.int64))
    sizes = {name: shape for name, (_, shape) in at.items()}
    sizes["logits_idx"] = (rows,)
    padded = make_layout(
        sizes,
        layout.num_tokens,
        layout.num_sample,
        layout.all_decode,
        layout.pre_qmax,
        layout.ext_qmax,
    )
    return flat, padded


def attention_out(runner, rows: int) -> torch.Tensor:
    """The buffer a graphed step's attention writes into, outside the graph pool: ``rows``
    token rows and a dummy row the padded query rows scatter into."""
    s = runner.shape
    return torch.zeros(
        rows + 1, s["num_heads"], s["head_dim"], dtype=runner.cache.k[0].dtype, device=runner.device
    )


@dataclass(frozen=True)
class AttentionCall:
    """One layer's attention as a capture met it: what the replay runs between two pieces."""

    layer: int
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    scale: float


@dataclass
class Split:
    """``AttnMeta.split`` of a piecewise forward. Without a pool (the CPU emulation, the
    warm-up) it runs each layer's attention; with the graph pool it also ends the piece being
    captured before and begins the next one after, recording the call."""

    pool: tuple | None = None
    graphs: list = field(default_factory=list)
    calls: list[AttentionCall] = field(default_factory=list)
    count: int = 0

    def begin(self) -> None:
        if self.pool is not None:
            graph = torch.cuda.CUDAGraph()
            graph.capture_begin(pool=self.pool)
            self.graphs.append(graph)

    def end(self) -> None:
        if self.pool is not None:
            self.graphs[-1].capture_end()

    def __call__(
        self,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        scale: float,
        meta: AttnMeta,
    ) -> torch.Tensor:
        self.count += 1
        self.end()
        if self.pool is not None:
            aliases = (unowned(t) for t in (query, key, value))
            self.calls.append(AttentionCall(layer, *aliases, scale))
        out = attend(layer, query, key, value, scale, meta)
        self.begin()
        return out


@dataclass
class PieceSet:
    """The graphs of one (slot, bucket): layers + 1 pieces and the attention calls between."""

    graphs: list
    calls: list[AttentionCall]


class MixedGraphs:
    """The runner's piecewise graphs: the buckets' layouts, the attention output buffer, the
    captured (slot, bucket) piece sets, and a step's packing and replay."""

    def __init__(self, runner, buckets: list[int]) -> None:
        self.runner = runner
        self.buckets = list(buckets)
        self.num_logits = runner.max_outputs
        s = runner.shape
        self.layers = s["num_layers"]
        self.out = attention_out(runner, max(buckets))
        self.dummies = {b: self._dummy(b) for b in self.buckets}
        self.sets: dict[tuple[int, int], PieceSet] = {}

    @property
    def pieces(self) -> int:
        """Graphs a step replays (StepPlan.pieces): one more than the layers."""
        return self.layers + 1

    @property
    def out_bytes(self) -> int:
        return self.out.numel() * self.out.element_size()

    def pack(self, batch, carry: np.ndarray | None, bucket: int) -> tuple[np.ndarray, Layout]:
        """A step with prompt tokens as the bucket's layout (see the module docstring)."""
        r = self.runner
        flat, layout = pack(
            batch,
            r.cache.scratch_block,
            carry,
            r.carry_len,
            token_multiple=bucket,
            short_max=r.short_max,
        )
        return pad_logits(flat, layout, self.num_logits)

    def _dummy(self, bucket: int) -> tuple[np.ndarray, Layout]:
        """A bucket of padding: one prompt chunk writing the scratch block (capture, warm-up)."""
        r = self.runner
        flat, layout = dummy_prefill(bucket, r.block_size, r.cache.scratch_block, r.carry_len)
        return pad_logits(flat, layout, self.num_logits)

    @torch.inference_mode()
    def body(self, slot: IOSlot, layout: Layout, split: Split) -> None:
        """The forward with its attention calls through ``split``: the metadata is derived
        eagerly, then piece 0 begins with the carry-over and the last ends with the argmax."""
        r = self.runner
        v = layout.views(slot.dev_in)
        meta = r.attn_meta(v, layout, out=self.out, split=split)
        split.begin()
        r.carry_in(slot, v)
        r.forward(slot, v, meta)
        split.end()
        if split.count != self.layers:
            raise ConfigError(
                f"engine.mixed_graphs=buckets: the model called attention {ATTN_NAME!r} "
                f"{split.count} times in {self.layers} layers (it must split every layer); "
                "allowed for this model: engine.mixed_graphs=off"
            )

    def run(self, slot: IOSlot, layout: Layout, bucket: int) -> None:
        """Replay the (slot, bucket) pieces; the same forward eagerly where none were captured
        (the CPU emulation)."""
        pieces = self.sets.get((slot.index, bucket))
        if pieces is None:
            self.body(slot, layout, Split())
        else:
            self.replay(slot, layout, pieces)

    @torch.inference_mode()
    def replay(self, slot: IOSlot, layout: Layout, pieces: PieceSet) -> None:
        """The step's metadata derived eagerly, then piece 0, and each layer's attention from
        the q/k/v its piece left in the pool into ``out`` before the next piece reads it."""
        meta = self.runner.attn_meta(layout.views(slot.dev_in), layout, out=self.out)
        graphs = pieces.graphs
        graphs[0].replay()
        for call, graph in zip(pieces.calls, graphs[1:]):
            attend(call.layer, call.query, call.key, call.value, call.scale, meta)
            graph.replay()

    def capture(self, stream: torch.cuda.Stream, pool: tuple) -> None:
        """Every (slot, bucket), largest bucket first, on ``pool`` (the decode graphs' one): a
        warm-up forward per bucket, then each slot's pieces. The pieces' GEMMs run on the
        library eager steps use (mode.blas), as the simulator charges them."""
        order = sorted(self.buckets, reverse=True)
        first = self.runner.slots[0]
        with torch.cuda.stream(stream):
            for b in order:  # Triton compiles, cuBLAS picks its kernels, outside any capture
                self._load(first, b)
                self.body(first, self.dummies[b][1], Split())
        torch.cuda.synchronize()
        gc.collect()  # as torch.cuda.graph does: no collection frees tensors mid-capture
        with torch.cuda.stream(stream):
            for slot in self.runner.slots:
                for b in order:
                    self._load(slot, b)
                    split = Split(pool)
                    self.body(slot, self.dummies[b][1], split)
                    self.sets[(slot.index, b)] = PieceSet(split.graphs, split.calls)
                    if self.runner.upload_graphs:  # the first launches, here: not in a step
                        self.replay(slot, self.dummies[b][1], self.sets[(slot.index, b)])
        torch.cuda.synchronize()

    @property
    def num_graphs(self) -> int:
        return sum(len(p.graphs) for p in self.sets.values())

    def _load(self, slot: IOSlot, bucket: int) -> None:
        flat = self.dummies[bucket][0]
        slot.dev_in[: flat.size].copy_(torch.from_numpy(flat).to(self.runner.device))
