"""Structured config schema: one dataclass per Hydra group.

Hydra/OmegaConf check types and unknown keys while composing; the value checks live in each
dataclass's ``__post_init__``, which runs when ``load_config`` turns the composed DictConfig into
objects, so a bad value fails before anything runs and names the key and the allowed values.
Every number that matters has a comment saying where it came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cbsim.config.errors import ConfigError, check_choice, check_positive, check_range

MODES = ("sim", "runtime")
TASKS = ("run", "calibrate", "validate")
ENGINES = ("sync", "async", "compare")
DTYPES = ("bfloat16", "float16", "float32")
LENGTH_DISTS = ("fixed", "uniform", "lognormal", "file")
ARRIVALS = ("offline", "poisson")
STREAM_MODES = ("three", "default")


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
    # seed shape; seed 32 x (256 + 8192) async 101.5 s -> 82.3 s, experiments/runtime/README.md)
    fuse_norm_rope: bool = True

    def __post_init__(self) -> None:
        check_choice("mode.name", self.name, MODES)
        # (no "flex": the runtime implements none; it refused it only after building the model)
        check_choice("mode.attention", self.attention, ("auto", "torch", "triton"))
        if self.name == "runtime" and self.attention == "triton" and self.device.startswith("cpu"):
            raise ConfigError(
                "mode.attention=triton needs CUDA; allowed with mode.device=cpu: torch or auto"
            )
        check_range("mode.warmup_steps", self.warmup_steps, 0, 1000)


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
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    dtype: str = "bfloat16"
    # runtime: a local checkpoint directory (config.json + safetensors); None = seeded random weights
    path: str | None = None
    # runtime: std of the random init; small enough that 32+ layers keep activations finite
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for key in (
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "vocab_size",
            "max_position_embeddings",
        ):
            check_positive(f"model.{key}", getattr(self, key))
        check_choice("model.dtype", self.dtype, DTYPES)
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model.num_heads={self.num_heads} must be a multiple of "
                f"model.num_kv_heads={self.num_kv_heads} (grouped-query attention)"
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
class PhaseCost:
    """A host phase's cost: fixed + per request + per token + per KV block (microseconds)."""

    fixed_us: float = 0.0
    per_request_us: float = 0.0
    per_token_us: float = 0.0
    # per KV-cache block in the batch's block tables (sum over requests of ceil(context / block),
    # counted as kv_tokens // block_size + requests): building and packing the tables grows with
    # the context (h200_run2: prepare 280 -> 370 us, launch 650 -> 850 us over seed_8192). 0 = none
    per_block_us: float = 0.0

    def cost(self, requests: int, tokens: int, blocks: int = 0) -> float:
        return (
            self.fixed_us
            + self.per_request_us * requests
            + self.per_token_us * tokens
            + self.per_block_us * blocks
        )


@dataclass
class HostCosts:
    """CPU-side costs of the batching loop, microseconds (the stack's, not the silicon's)."""

    schedule: PhaseCost = field(default_factory=PhaseCost)
    prepare: PhaseCost = field(default_factory=PhaseCost)
    update: PhaseCost = field(default_factory=PhaseCost)
    # CPU time to launch one kernel eagerly (cudaLaunchKernel through PyTorch's dispatcher)
    kernel_launch_us: float = 5.0
    # CPU time to launch a captured graph (cudaGraphLaunch)
    graph_launch_us: float = 10.0
    # CPU time per KV-cache block of the batch (kv_tokens // block_size + requests) inside a
    # launch: the runtime's copy-in stages the block tables there (h200_run2: launch 700 us at 1K
    # context, 1,100 us at 8K); 0 = a launch independent of the context
    launch_per_block_us: float = 0.0
    # CPU time to enqueue one async copy
    copy_launch_us: float = 4.0
    # CPU time to record one event or make a stream wait on one
    event_us: float = 1.0
    # wake-up latency of a host blocked on an event after the GPU signals it
    sync_wake_us: float = 5.0
    # a periodic host stall (Python's cyclic garbage collector, allocator trims): every
    # `stall_every_steps`-th update takes `stall_us` longer; 0 = never (simulator only)
    stall_us: float = 0.0
    stall_every_steps: int = 0

    def __post_init__(self) -> None:
        for phase in ("schedule", "prepare", "update"):
            for term in ("fixed_us", "per_request_us", "per_token_us", "per_block_us"):
                value = getattr(getattr(self, phase), term)
                if value < 0:
                    raise ConfigError(f"hardware.host.{phase}.{term}={value} must be >= 0")
        for key in (
            "kernel_launch_us",
            "graph_launch_us",
            "launch_per_block_us",
            "copy_launch_us",
            "event_us",
            "sync_wake_us",
            "stall_us",
            "stall_every_steps",
        ):
            if getattr(self, key) < 0:
                raise ConfigError(f"hardware.host.{key}={getattr(self, key)} must be >= 0")


@dataclass
class GpuCosts:
    """Achieved fractions of the roofline per operation kind and fixed GPU-side gaps."""

    # fraction of HBM bandwidth reached streaming weights in skinny GEMMs (BRIEF: 2.2-2.9 of 4.27 TB/s)
    gemm_bandwidth_eff: float = 0.6
    # fraction of peak FLOP/s reached in compute-bound GEMMs (prefill)
    gemm_flops_eff: float = 0.7
    # fraction of HBM bandwidth reached reading the KV cache in attention
    attention_bandwidth_eff: float = 0.5
    # fraction of peak FLOP/s reached in prefill attention
    attention_flops_eff: float = 0.4
    # the attention kernel reads KV padded up to a multiple of this many tokens (1: live KV only)
    attention_kv_pad: int = 1
    # fixed GPU time per forward pass not covered above (norms, rope, sampling), microseconds
    forward_fixed_us: float = 50.0
    # GPU idle between consecutive kernels launched eagerly, microseconds
    eager_kernel_gap_us: float = 2.0
    # GPU idle per kernel node inside a replayed graph, microseconds
    graph_node_gap_us: float = 0.5
    # kernels per transformer layer (eager launches / graph nodes)
    kernels_per_layer: int = 14
    # kernels outside the layers (embedding, final norm, LM head, sampling)
    kernels_extra: int = 6
    # Kernels by the attention groups a step holds, on top of kernels_per_layer (0: one count
    # for every step). The runtime's counts (experiments/runtime/diag_launch/run8, Kineto,
    # Llama-3-8B on the H200): decode graph 565 nodes, eager prompt-only step 731, decode rows
    # + prompt starts 828, + chunks after a cached prefix 1256. Per layer when the step has
    # decode rows (their attention: split-K, reduce, the scatter into a mixed step's output):
    decode_kernels_per_layer: int = 0
    # per layer and once per forward when it has prompt chunks from position 0 (causal flash)
    prefill_kernels_per_layer: int = 0
    prefill_kernels_extra: int = 0
    # per layer and once per forward when it has chunks after a cached prefix (gather the
    # blocks, build the mask, masked attention)
    prefix_kernels_per_layer: int = 0
    prefix_kernels_extra: int = 0
    # The attention of a step with prompt chunks runs as this runtime runs it (runtime/attention.py):
    # prompt starts padded to the longest (causal), continuations padded to the longest and masked
    # against the whole gathered table. false: varlen kernels, exact causal work per chunk
    attention_padded_groups: bool = False
    # Continuations (chunks after a cached prefix) go through the masked kernel, a few query rows
    # per (request, kv head) walking the whole gathered table: besides FLOPs and bytes it takes
    # this long per token of the widest continuation's table, all layers together (h200_run8
    # long_prompt: 2-7 rows against an 8208-token table added 15-30 ms to a 255 ms step). 0 = none
    prefix_walk_us_per_token: float = 0.0
    # Launches the driver queues before cudaLaunchKernel blocks the host: an eager forward
    # whose kernels outrun the GPU by this many returns only as the GPU catches up (H200,
    # CUDA 13: 1021, experiments/runtime/diag_launch: the 1022nd launch behind a sleeping
    # kernel blocked). A graph replay is one launch. 0 = unbounded
    launch_queue_depth: int = 0
    # GPU time of the in-graph carry-over scatter-add, microseconds
    carry_over_us: float = 3.0
    # GPU time per computed row (query token, a decode graph's padded rows included) on the
    # memory-bound side of the linear layers, beyond streaming weights and activations: skinny
    # GEMMs slow down with M (h200_run1, decode at batch 4, 8, 32: 7018 + 22.6 x rows + 0.0292 x KV
    # tokens us). Prefill is FLOP-bound, so it does not pay it. 0 = none
    gemm_row_us: float = 0.0
    # The split-K decode-attention kernel (runtime/kernels/paged_attention.py, pick_partition):
    # each (request, kv head, partition) program walks its partition's KV tiles one after another,
    # so besides the KV bytes the kernel takes this long per KV token of the longest walk, all
    # layers together: min(longest decode context, partition). h200_run2 seed_8192: 0.038 us per
    # KV token below 4096 context, 0.020 above, where the partition (4096 tokens) splits in two.
    # 0 = attention bound by bytes and FLOPs only
    attention_walk_us_per_token: float = 0.0
    # pick_partition's rule: about this many programs at full table width, partitions of at
    # least this many tokens (a power of two); the table is as wide as the longest request
    attention_target_programs: int = 1024
    attention_min_partition: int = 1024
    # A compute stream that sat idle runs its next forward slower (clocks and caches cooling
    # down while the host works): the forward takes idle_slowdown us longer per us of idle before
    # it (sync vs async on the same batches: h200_run1 and run3 +5..60 us after 0.3..1.5 ms of
    # idle, about 0.04 us per idle us; h200_run2 about 1, as its forward span also holds the
    # 700 us graph launch). A threshold below which idling costs nothing (about 150 us in run1)
    # is not separable from forward_fixed_us in these recordings, so there is none. 0 = a
    # forward independent of what came before
    idle_slowdown: float = 0.0

    def __post_init__(self) -> None:
        for key in (
            "gemm_bandwidth_eff",
            "gemm_flops_eff",
            "attention_bandwidth_eff",
            "attention_flops_eff",
        ):
            value = getattr(self, key)
            if not 0.0 < value <= 1.0:
                raise ConfigError(f"hardware.gpu.{key}={value} must be in (0, 1]")
        check_positive("hardware.gpu.attention_kv_pad", self.attention_kv_pad)
        check_positive("hardware.gpu.kernels_per_layer", self.kernels_per_layer)
        for key in (
            "kernels_extra",
            "decode_kernels_per_layer",
            "prefill_kernels_per_layer",
            "prefill_kernels_extra",
            "prefix_kernels_per_layer",
            "prefix_kernels_extra",
            "launch_queue_depth",
        ):
            check_range(f"hardware.gpu.{key}", getattr(self, key), 0, 1 << 20)
        check_positive("hardware.gpu.attention_target_programs", self.attention_target_programs)
        check_positive("hardware.gpu.attention_min_partition", self.attention_min_partition)
        for key in (
            "gemm_row_us",
            "attention_walk_us_per_token",
            "idle_slowdown",
            "prefix_walk_us_per_token",
        ):
            if getattr(self, key) < 0:
                raise ConfigError(f"hardware.gpu.{key}={getattr(self, key)} must be >= 0")


@dataclass
class HardwareConfig:
    """A GPU plus the software stack on it: datasheet/measured rates and fitted costs."""

    name: str = "h200"
    # dense bf16 matrix rate, FLOP/s (measured on the H200 here: 788 TFLOP/s on random data)
    peak_flops: float = 788e12
    # HBM copy bandwidth, bytes/s, read+write counted (measured on the H200 here: 4.27 TB/s)
    hbm_bandwidth: float = 4.27e12
    # device memory, bytes (H200: 141 GB, 139 GiB visible)
    memory_bytes: float = 141e9
    # pinned host <-> device copy bandwidth, bytes/s (PCIe Gen5 x16, about 55 GB/s achieved)
    h2d_bandwidth: float = 55e9
    d2h_bandwidth: float = 55e9
    # fixed latency of one small async copy on the GPU side, microseconds
    copy_latency_us: float = 8.0
    host: HostCosts = field(default_factory=HostCosts)
    gpu: GpuCosts = field(default_factory=GpuCosts)
    # where these numbers came from, for the report
    source: str = "datasheet and measurements on the H200 here (BRIEF)"

    def __post_init__(self) -> None:
        for key in (
            "peak_flops",
            "hbm_bandwidth",
            "memory_bytes",
            "h2d_bandwidth",
            "d2h_bandwidth",
        ):
            check_positive(f"hardware.{key}", getattr(self, key))
        if self.copy_latency_us < 0:
            raise ConfigError(f"hardware.copy_latency_us={self.copy_latency_us} must be >= 0")


@dataclass
class EngineConfig:
    """How the batching loop is driven: sync, async, or both side by side."""

    name: str = "async"
    # IO slots (pinned host + device input buffers): async needs 2; 1 shows the overwrite hazard
    io_slots: int = 2
    cuda_graphs: bool = True
    # "three": H2D, compute and D2H on their own streams; "default": everything on the legacy
    # default stream, which serialises with every other stream (the pitfall: all overlap lost)
    streams: str = "three"
    # in-graph token carry-over (input_ids += scatter(carry, outputs)); async requires it
    carry_over: bool = True
    # make streams wait on events; off shows the missing-wait hazard in the simulator
    event_waits: bool = True
    # padded batch sizes (requests) for which a graph is captured; larger batches run eagerly
    graph_batch_sizes: list[int] = field(
        default_factory=lambda: [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256]
    )

    def __post_init__(self) -> None:
        check_choice("engine.name", self.name, ENGINES)
        check_choice("engine.streams", self.streams, STREAM_MODES)
        check_range("engine.io_slots", self.io_slots, 1, 2)
        if self.name in ("async", "compare") and not self.carry_over:
            raise ConfigError(
                f"engine.carry_over=false is impossible with engine.name={self.name}: batch N+1 "
                "is built before batch N's tokens exist; allowed: engine.carry_over=true, "
                "or engine.name=sync"
            )
        if not self.graph_batch_sizes or any(b <= 0 for b in self.graph_batch_sizes):
            raise ConfigError(
                f"engine.graph_batch_sizes={list(self.graph_batch_sizes)} must be a non-empty "
                "list of positive batch sizes"
            )


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
                    f"workload.{which}_spread={spread} must be >= 0 (and < 1 for uniform)"
                )
            if getattr(self, f"{which}_dist") == "file" and not getattr(self, f"{which}_file"):
                raise ConfigError(
                    f"workload.{which}_dist=file needs workload.{which}_file (a file of lengths)"
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
                f"workload.batch_size={self.batch_size}: a full decode batch would not fit"
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
class OutputConfig:
    """What every run writes into its Hydra run directory."""

    # gzip the trace (trace.json.gz) — the seed workload's full trace is tens of MB as text
    trace_gzip: bool = False
    report: bool = True
    # print the metrics table at the end of the run
    print_table: bool = True


@dataclass
class CbsimConfig:
    """The root: one run of one task."""

    mode: ModeConfig = field(default_factory=ModeConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    # "run": simulate or execute; "calibrate"/"validate": fit or check the cost model on traces
    task: str = "run"
    # input traces for calibrate/validate (paths or globs)
    trace: list[str] = field(default_factory=list)
    # free-form description an experiment preset sets for the report
    description: str = ""
    # extra experiment-specific settings (documented in each experiment file)
    extra: dict[str, Any] = field(default_factory=dict)

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
                "engine.streams=default is a simulator what-if; allowed with mode=runtime: three"
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
                f"model.max_position_embeddings={self.model.max_position_embeddings}"
            )
