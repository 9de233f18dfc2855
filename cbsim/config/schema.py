"""Structured config schema: one dataclass per Hydra group.

Hydra/OmegaConf check types and unknown keys while composing; the value checks live in each
dataclass's ``__post_init__``, which runs when ``load_config`` turns the composed DictConfig into
objects, so a bad value fails before anything runs and names the key and the allowed values.
Every number that matters has a comment saying where it came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cbsim.config.decode_launch import DecodeLaunchConfig as DecodeLaunchConfig
from cbsim.config.errors import ConfigError, check_choice, check_positive, check_range

# the hardware group lives in cbsim/config/hardware.py; re-exported here with the other groups
from cbsim.config.hardware import GpuCosts as GpuCosts
from cbsim.config.hardware import HardwareConfig
from cbsim.config.hardware import HostCosts as HostCosts
from cbsim.config.hardware import PhaseCost as PhaseCost
from cbsim.config.limits import LimitsConfig
from cbsim.config.output import OutputConfig as OutputConfig
from cbsim.config.ranges import POSITIVE
from cbsim.config.slo import SloConfig as SloConfig

MODES = ("sim", "runtime")
BLAS_LIBRARIES = ("cublas", "cublaslt")  # torch.backends.cuda.preferred_blas_library's
TASKS = (
    "run",
    "calibrate",
    "validate",
    "profile_kernels",
    "capacity",
    "profile_machine",
    "record_set",
    "datasheets",
)
ENGINES = ("sync", "async", "compare")
DTYPES = ("bfloat16", "float16", "float32")
LENGTH_DISTS = ("fixed", "uniform", "lognormal", "file")
ARRIVALS = ("offline", "poisson")
STREAM_MODES = ("three", "one", "default")
MIXED_GRAPHS = ("auto", "full", "buckets", "off")
GRAPH_MEMSETS = ("kernels", "keep")
BAND_CHOICES = ("auto", "true", "false")
# the extra keys task=run reads, each with what it does (calibrate and validate declare theirs
# in cbsim.validation.tasks.EXTRA_KEYS, capacity in cbsim.capacity.EXTRA_KEYS; profile_kernels
# checks its own grid; cbsim.preflight refuses any other)
RUN_EXTRA_KEYS = {
    "reported": "the figures the brief reports for this workload (conf/experiment/seed_repro.yaml)",
}


@dataclass
class ModeConfig:
    """Which back end runs: the SimPy model or the real engine on a GPU."""

    name: str = "sim"
    # runtime only: torch device ("cuda", "cuda:1", "cpu"; the async engine needs CUDA)
    device: str = "cuda"
    # runtime only: record host phases and stream ops (tracing costs under 1% of wall time)
    tracing: bool = True
    # runtime only: attention back end for the paged KV cache ("auto" picks the fastest that runs)
    attention: str = "auto"
    # runtime only: forward steps run and thrown away before timing starts (graph capture, autotune)
    warmup_steps: int = 2
    # runtime on CUDA only: one GEMM for q/k/v and one for gate/up (runtime/kernels; issue 7:
    # 0.44 ms/step less at the 8B seed shape on the H200, experiments/perf-notes.md)
    fuse_projections: bool = True
    # runtime on CUDA only: RMSNorm and RoPE as one Triton kernel each (2.1 ms/step less at the 8B
    # seed shape; seed 32 x (256 + 8192) async 101.5 s -> 82.3 s, runtime/README.md)
    fuse_norm_rope: bool = True
    # runtime on CUDA only, and the simulator's kernel count and table rows: the residual adds
    # inside the o_proj and down GEMMs, SiLU x up and the K/V cache write one Triton kernel each
    # (4 kernels fewer per layer; experiments/perf-notes.md). A recording says whether its build
    # did: otherData.fused, else its manifest's fused_epilogues
    fuse_epilogues: bool = True
    # runtime on CUDA only (with fuse_norm_rope and fuse_epilogues), and the simulator's kernel
    # count: RoPE rotates q and k inside the K/V cache write, one kernel where those were two
    # (runtime/kernels/rope_kv.py). A recording says whether its build did: otherData.fused
    fuse_rope_kv: bool = True
    # runtime on CUDA only: the BLAS library torch's GEMMs go to (torch.backends.cuda.
    # preferred_blas_library) in eager steps (prefill, mixed, batches past the last graph):
    # cublas, torch's default (cuBLASLt's prefill GEMMs are 11-18% slower, experiments/perf/blas)
    blas: str = "cublas"
    # the same for the decode graphs, fixed when they are captured: cublaslt (the 8B decode
    # step at 32 requests 3.6% shorter, the 1B at 128 2%, experiments/perf/blas). The simulator
    # prices a graph step's GEMMs from the table's rows of that library where it has them.
    # A recording says which (otherData.blas, otherData.graph_blas)
    graph_blas: str = "cublaslt"
    # runtime on CUDA only, and the simulator's table row: greedy sampling's argmax as a
    # two-stage Triton kernel (chunks of the vocabulary, then the chunks' maxima): a program per
    # row walking 128K logits takes 26-27 us at any batch (experiments/kernels/h200)
    split_argmax: bool = True
    # sim only: P5 / median / P95 of total time, GPU idle and async speedup (cbsim.bands; 2 x
    # hardware.host.spread.draws more simulations): auto = for a single run whose profile has a
    # spread, not inside sweep jobs; true = always; false = never. A measurement has no band
    bands: str = "auto"

    def __post_init__(self) -> None:
        check_choice("mode.name", self.name, MODES)
        self.bands = str(self.bands).lower()  # the command line's mode.bands=true is a bool
        check_choice("mode.bands", self.bands, BAND_CHOICES)
        if self.name == "runtime" and self.bands == "true":
            raise ConfigError(
                "mode.bands=true with mode=runtime: a measurement has no band (bands are the "
                "simulator's spread of host speed); allowed with mode=runtime: auto, false"
            )
        # (no "flex": the runtime implements none; it refused it only after building the model)
        check_choice("mode.attention", self.attention, ("auto", "torch", "triton"))
        if self.name == "runtime" and self.attention == "triton" and self.device.startswith("cpu"):
            raise ConfigError(
                "mode.attention=triton needs CUDA; allowed with mode.device=cpu: torch or auto"
            )
        check_range("mode.warmup_steps", self.warmup_steps, 0, 1000)
        check_choice("mode.blas", self.blas, BLAS_LIBRARIES)
        check_choice("mode.graph_blas", self.graph_blas, BLAS_LIBRARIES)

    def rope_in_kv_write(self) -> bool:
        """Whether the build rotates q and k in the K/V write: fuse_rope_kv with the rotary
        wrapper (fuse_norm_rope) and the cache's own kernel (fuse_epilogues) it joins."""
        return self.fuse_rope_kv and self.fuse_norm_rope and self.fuse_epilogues


@dataclass
class ModelConfig:
    """A decoder-only transformer's shape (Llama family)."""

    name: str = "llama3_8b"
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_layers: int = 32
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    max_position_embeddings: int = 131072
    rope_theta: float = field(default=500000.0, metadata=POSITIVE)
    rms_norm_eps: float = field(default=1e-5, metadata=POSITIVE)
    tie_word_embeddings: bool = False
    dtype: str = "bfloat16"
    # runtime: a local checkpoint directory (config.json + safetensors); None = seeded random weights
    path: str | None = None
    # runtime: std of the random init; small enough that 32+ layers keep activations finite
    init_std: float = field(default=0.02, metadata=POSITIVE)

    def __post_init__(self) -> None:
        sizes = ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads")
        for key in (*sizes, "head_dim", "vocab_size", "max_position_embeddings"):
            check_positive(f"model.{key}", getattr(self, key))
        check_choice("model.dtype", self.dtype, DTYPES)
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model.num_kv_heads={self.num_kv_heads} does not divide model.num_heads="
                f"{self.num_heads}; allowed: a divisor of it (grouped-query attention)"
            )
        check_positive("model.init_std", self.init_std)

    @property
    def dtype_bytes(self) -> int:
        return 4 if self.dtype == "float32" else 2

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer: 128 KiB for the Llama-3-8B shape in bf16 (BRIEF)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def layer_params(self) -> int:
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attn = h * self.num_heads * self.head_dim + 2 * h * kv + self.num_heads * self.head_dim * h
        mlp = 3 * h * self.intermediate_size
        return attn + mlp + 2 * h

    @property
    def num_params(self) -> int:
        emb = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else emb
        return self.num_layers * self.layer_params + emb + head + self.hidden_size

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes


@dataclass
class EngineConfig:
    """How the batching loop is driven: sync, async, or both side by side."""

    name: str = "async"
    # IO slots (pinned host + device input buffers): async needs 2; 1 shows the overwrite hazard
    io_slots: int = 2
    cuda_graphs: bool = True
    # "three": H2D, compute and D2H on their own streams; "one": all on one, as sync always runs
    # (the copies wait for the forwards: the H200's decode step 20-28 us longer, the H200's recordings);
    # "default": the legacy default stream, serialising with every other (sim only: no overlap)
    streams: str = "three"
    # in-graph token carry-over (input_ids += scatter(carry, outputs)); async requires it
    carry_over: bool = True
    # make streams wait on events; off shows the missing-wait hazard in the simulator
    event_waits: bool = True
    # each captured graph replayed once at capture, so its first launch's upload (hardware.host.
    # graph_first_replay_us_per_kernel) is paid before the loop, not in a step (both back ends;
    # a recording says whether its build did: otherData.graphs_uploaded, else false)
    upload_graphs: bool = True
    # padded batch sizes (requests) for which a graph is captured; larger batches run eagerly
    graph_batch_sizes: list[int] = field(
        default_factory=lambda: [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256]
    )
    # a graph per launch class of the decode kernel as well (cbsim.costs.decode_kernel): a step
    # replays the narrowest block table that holds its longest request (8448-token tables cost
    # 7-26 us a layer more at 256-4096 tokens, experiments/kernels/table_width/); false: every
    # graph's table is as wide as the run's longest request. The simulator follows which graph
    # a step replays; its kernel tables time each context at its own width
    graph_width_classes: bool = True
    # steps with prompt tokens run over their tokens rounded up to this (both back ends), each
    # such GEMM shape warmed up: cuBLAS takes 0.3-2.7 ms of host time at a shape new to the
    # process, 4-10 ms a mixed step (a diagnostic over the H200's recordings); 1: off
    eager_token_multiple: int = 64
    # continuation chunks of up to this many tokens attend through the paged decode kernel, a
    # row per token, not the masked path (cbsim/costs/attention_groups.py); 0: never. Off until
    # timed on the GPU (benchmarks/bench_continuation.py): the recorded mixed steps it would
    # shorten were host-launch bound (the H200's recordings)
    continuation_decode_max: int = 0
    # how the Triton decode kernel launches over a table of a given width (both back ends)
    decode_launch: DecodeLaunchConfig = field(default_factory=lambda: DecodeLaunchConfig())
    # "buckets": prompt steps replayed from piecewise graphs over token-count buckets, attention
    # eager between the pieces (costs/mixed_graphs.py, runtime/piecewise.py); "full": one graph
    # per bucket, attention inside it (runtime/full_graphs.py); "off": prompt steps launched
    # eagerly, the what-if both back ends model; "auto": full where CUDA graphs run with the
    # Triton attention, else off (costs/mixed_graphs.py: mixed_graphs_mode)
    mixed_graphs: str = "auto"
    # "kernels": a captured graph's memset nodes (cuBLAS zeroing its workspace before a
    # cooperative GEMM, from 768 tokens on) rewritten as fill kernel nodes, which the driver
    # launches with the rest (a memset node costs about 1.7 us of host time at replay, a kernel
    # node 0.03 us; runtime/graph_memsets.py); "keep": as captured. Runtime only: the simulator's
    # graph launch costs are fitted on recorded launches
    graph_memsets: str = "kernels"

    def __post_init__(self) -> None:
        check_choice("engine.name", self.name, ENGINES)
        check_choice("engine.streams", self.streams, STREAM_MODES)
        check_range("engine.io_slots", self.io_slots, 1, 2)
        check_range("engine.eager_token_multiple", self.eager_token_multiple, 1, 1024)
        check_range("engine.continuation_decode_max", self.continuation_decode_max, 0, 8192)
        check_choice("engine.mixed_graphs", self.mixed_graphs, MIXED_GRAPHS)
        check_choice("engine.graph_memsets", self.graph_memsets, GRAPH_MEMSETS)
        if self.name in ("async", "compare") and not self.carry_over:
            raise ConfigError(
                f"engine.carry_over=false is impossible with engine.name={self.name} (batch N+1 is "
                "built before N's tokens exist); allowed: true, or engine.name=sync"
            )
        if not self.graph_batch_sizes or any(b <= 0 for b in self.graph_batch_sizes):
            sizes = list(self.graph_batch_sizes)
            raise ConfigError(f"engine.graph_batch_sizes={sizes}; allowed: non-empty, each > 0")


@dataclass
class WorkloadConfig:
    """The requests and the continuous-batching limits."""

    # concurrent requests per batch (max_num_seqs)
    batch_size: int = 32
    # total requests; None = one per batch slot (offline, one wave)
    num_requests: int | None = None
    # prompt length: the value for "fixed", the mean for "uniform" and "lognormal"
    prompt_len: int = 256
    prompt_dist: str = "fixed"
    # uniform: +- this fraction of the mean; lognormal: sigma of log(length)
    prompt_spread: float = 0.0
    prompt_file: str | None = None
    # new tokens per request, with the same distribution knobs
    gen_len: int = 1024
    gen_dist: str = "fixed"
    gen_spread: float = 0.0
    gen_file: str | None = None
    # "offline": every request at t=0; "poisson": exponential inter-arrival times at `rate`
    arrival: str = "offline"
    # requests per second for poisson arrivals
    rate: float = 10.0
    # token budget per forward pass (query tokens summed over the batch)
    max_batch_tokens: int = 8192
    # split prompts longer than the remaining budget across steps
    chunked_prefill: bool = True
    # paged KV cache: tokens per block and blocks in all; None = enough for every request at once
    kv_block_size: int = 16
    kv_num_blocks: int | None = None
    # EOS off, as in the reported workload: every request runs to gen_len
    ignore_eos: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        check_range("workload.batch_size", self.batch_size, 1, 1 << 16)
        if self.num_requests is not None:
            check_range("workload.num_requests", self.num_requests, 1, 1 << 24)
        check_range("workload.prompt_len", self.prompt_len, 1, 1 << 24)
        check_range("workload.gen_len", self.gen_len, 1, 1 << 24)
        check_choice("workload.prompt_dist", self.prompt_dist, LENGTH_DISTS)
        check_choice("workload.gen_dist", self.gen_dist, LENGTH_DISTS)
        check_choice("workload.arrival", self.arrival, ARRIVALS)
        for which in ("prompt", "gen"):
            spread = getattr(self, f"{which}_spread")
            if spread < 0 or (getattr(self, f"{which}_dist") == "uniform" and spread >= 1):
                raise ConfigError(
                    f"workload.{which}_spread={spread} is out of range; allowed: >= 0 "
                    "(and < 1 for uniform)"
                )
            dist, path = getattr(self, f"{which}_dist"), getattr(self, f"{which}_file")
            if dist == "file" and not path:
                raise ConfigError(
                    f"workload.{which}_dist=file names no file; allowed: workload.{which}_file="
                    "PATH (a file of lengths, one integer a line)"
                )
            if dist != "file" and path:
                raise ConfigError(
                    f"workload.{which}_file={path} is set but workload.{which}_dist={dist} "
                    f"ignores it; allowed: workload.{which}_dist=file, or no {which}_file"
                )
        if self.arrival == "poisson":
            check_positive("workload.rate", self.rate)
        check_range("workload.max_batch_tokens", self.max_batch_tokens, 1, 1 << 24)
        check_range("workload.kv_block_size", self.kv_block_size, 1, 4096)
        if self.kv_num_blocks is not None:
            check_range("workload.kv_num_blocks", self.kv_num_blocks, 1, 1 << 28)
        if self.max_batch_tokens < self.batch_size:
            raise ConfigError(
                f"workload.max_batch_tokens={self.max_batch_tokens} is below "
                f"workload.batch_size={self.batch_size} (a full decode batch would not fit); "
                "allowed: max_batch_tokens >= batch_size"
            )
        if not self.chunked_prefill and self.prompt_len > self.max_batch_tokens:
            raise ConfigError(
                f"workload.prompt_len={self.prompt_len} exceeds workload.max_batch_tokens="
                f"{self.max_batch_tokens} with workload.chunked_prefill=false; allowed: a "
                "larger max_batch_tokens or chunked_prefill=true"
            )

    @property
    def total_requests(self) -> int:
        return self.batch_size if self.num_requests is None else self.num_requests


@dataclass
class CbsimConfig:
    """The root: one run of one task."""

    mode: ModeConfig = field(default_factory=ModeConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    task: str = "run"  # run: simulate or execute; calibrate, validate: fit or check the costs
    # input traces for calibrate/validate (paths or globs)
    trace: list[str] = field(default_factory=list)
    # free-form description an experiment preset sets for the report
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # settings an experiment file documents

    def __post_init__(self) -> None:
        check_choice("task", self.task, TASKS)
        runtime = self.mode.name == "runtime"
        if self.engine.name in ("async", "compare") and runtime and self.engine.io_slots < 2:
            raise ConfigError(
                f"engine.io_slots=1 with engine.name={self.engine.name} is a data race on the "
                "real GPU (the host would overwrite inputs the GPU is reading); allowed in "
                "mode=sim only, where it is reported as a hazard"
            )
        if self.engine.streams == "default" and runtime:
            raise ConfigError(
                "engine.streams=default is a simulator what-if; allowed with mode=runtime: three, one"
            )
        if not self.engine.event_waits and runtime:
            raise ConfigError(
                "engine.event_waits=false is a simulator what-if (the runtime always orders its "
                "streams with events); allowed with mode=runtime: true"
            )
        longest = self.workload.prompt_len + self.workload.gen_len
        if (
            self.workload.prompt_dist == "fixed"
            and self.workload.gen_dist == "fixed"
            and longest > self.model.max_position_embeddings
        ):
            raise ConfigError(
                f"workload.prompt_len + workload.gen_len = {longest} exceeds "
                f"model.max_position_embeddings={self.model.max_position_embeddings}; allowed: "
                f"max_position_embeddings >= {longest}, or a shorter prompt_len + gen_len"
            )
