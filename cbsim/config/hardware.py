"""The hardware + stack profile (``hardware`` group): device rates, host costs, GPU costs.

Split from schema.py (which re-exports these) to keep one concept per file; every value is
checked in ``__post_init__`` like the rest of the schema.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cbsim.config.errors import ConfigError, check_choice, check_positive, check_range
from cbsim.config.gpu_clock import GpuClock as GpuClock
from cbsim.config.host_level import HostLevel as HostLevel
from cbsim.config.host_regimes import HostRegimes as HostRegimes
from cbsim.config.model_error import ModelError as ModelError
from cbsim.config.phase_cost import PhaseCost as PhaseCost
from cbsim.config.shipped_profiles import kernel_table_files as kernel_table_files
from cbsim.config.shipped_profiles import shipped_root

KERNEL_COUNTS_OF = ("unfused", "fused", "fused_rope_kv", "engine")
# how a profile's numbers were obtained, best first (hardware=auto ranks profiles by it):
# the one command on that GPU, fitted to recordings, a datasheet roofline, first estimates
TIERS = ("profiled", "fitted", "datasheet", "estimate")
PROFILE_TIERS = TIERS

REPO = Path(__file__).resolve().parents[2]
# HostCosts' own times (microseconds) beside its phases: what a host-speed factor scales
# (cbsim/bands.py), and with stall_every_steps what HostCosts checks to be >= 0
HOST_TIMES_US = (
    "kernel_launch_us",
    "eager_forward_us",
    "graph_launch_us",
    "launch_per_block_us",
    "copy_launch_us",
    "event_us",
    "sync_wake_us",
    "stall_us",
    "loop_start_us",
)


def check_keys(
    prefix: str, obj: object, keys: Iterable[str], ok: Callable[[float], bool], allowed: str
) -> None:
    """Each of ``keys`` on ``obj`` passes ``ok``: one message form for every group of the profile,
    naming the key and what is ``allowed``."""
    for key in keys:
        value = getattr(obj, key)
        if not ok(value):
            raise ConfigError(f"{prefix}.{key}={value} is out of range; allowed: {allowed}")


def check_non_negative(prefix: str, obj: object, keys: Iterable[str]) -> None:
    check_keys(prefix, obj, keys, lambda v: v >= 0, ">= 0")


def device_matches(device_name: str, gpu_name: str) -> bool:
    """Whether a profile's ``device_name`` names the GPU torch calls ``gpu_name`` (an empty
    device_name names none in particular, so it matches every GPU)."""
    wanted = device_name.strip().casefold()
    return not wanted or wanted in gpu_name.casefold()


@dataclass
class HostSpread:
    """The measured spread of host speed: the simulator's bands (cbsim/bands.py) draw a host-speed
    factor per simulation from it, every host cost multiplied by it. Each is the standard deviation
    of the log of the factor; 0 = no spread."""

    # between calls of the GPU machine (the same run in separate calls: another host, or the same
    # host loaded otherwise): the BRIEF's small-batch sync workload in four calls idled the GPU
    # 7.7 / 3.8 / 5.9 / 5.2% (idle there is host time the GPU waits out): std of log = 0.29
    between_calls: float = 0.0
    # within one run, step to step: a band's simulation draws the host's speed at each schedule,
    # for that schedule, prepare and update (the launch keeps its mean); 0 = every step at its mean
    within_run: float = 0.0
    # a band draws this many simulations per engine (P5/median/P95 of them), seeded from `seed`
    draws: int = 9
    seed: int = 0
    # true: this run is one draw of the host's variation, seeded by `seed`: the host phases cost
    # their mean times a mean-one factor drawn per step from within_run, and the host's levels
    # (regimes) are one realization; cbsim.bands sets it in its draws, a plain run keeps the means
    jitter: bool = False
    # in a draw: where in [0, 1) the host's level at t = 0 falls (slow below the slow share), so
    # a band's draws are stratified over the starting level; -1 = drawn from `seed`
    level_quantile: float = -1.0

    def __post_init__(self) -> None:
        check_keys(
            "hardware.host.spread",
            self,
            ("between_calls", "within_run"),
            lambda v: math.isfinite(v) and 0.0 <= v <= 2.0,
            "0 to 2",
        )
        check_range("hardware.host.spread.draws", self.draws, 1, 1000)
        check_range("hardware.host.spread.seed", self.seed, 0, 2**32 - 1)
        if self.level_quantile != -1.0:
            check_range("hardware.host.spread.level_quantile", self.level_quantile, 0.0, 1.0)


@dataclass
class HostCosts:
    """CPU-side costs of the batching loop, microseconds (the stack's, not the silicon's), at the
    host's fast level (``regimes`` says how much slower, and how often, it runs)."""

    schedule: PhaseCost = field(default_factory=PhaseCost)
    prepare: PhaseCost = field(default_factory=PhaseCost)
    update: PhaseCost = field(default_factory=PhaseCost)
    # CPU time to launch one kernel eagerly (cudaLaunchKernel through PyTorch's dispatcher)
    kernel_launch_us: float = 5.0
    # CPU time of an eager forward's own Python beside its kernels' launches, spread over them
    # (the GPU works meanwhile): told from kernel_launch_us only by eager forwards of two model
    # shapes (the H100's probes: the 8B 30 us a counted kernel, a 1B 47 us)
    eager_forward_us: float = 0.0
    # CPU time to launch a captured graph (cudaGraphLaunch)
    graph_launch_us: float = 10.0
    # the first launch of each captured graph (per IO slot and batch bucket) costs this much
    # more per graph node (the driver uploads the graph then): charged as measured, not scaled
    # by the host's level or a band's draw; 0 = every replay alike
    graph_first_replay_us_per_kernel: float = 0.0
    # CPU time per KV-cache block of the batch (kv_tokens // block_size + requests) inside a
    # launch: the runtime's copy-in stages the block tables there (the H200's recordings: launch 700 us at 1K
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
    # the loop's start: from the run's time zero to its first step's launch, beyond what the
    # first step's phases cost in steady state (the runtime records its trace anchor, and the
    # first schedule, prepare and copy run cold: 1-7 ms recorded, 0.5 ms simulated without it,
    # an H200 recording); the host waits it out before its first schedule
    loop_start_us: float = 0.0
    spread: HostSpread = field(default_factory=HostSpread)
    # the host's two speed levels over time; the costs above are the fast level
    regimes: HostRegimes = field(default_factory=HostRegimes)
    # which host the costs hold on and which the prediction is for, by one reading of its speed
    level: HostLevel = field(default_factory=HostLevel)

    def __post_init__(self) -> None:
        for phase in ("schedule", "prepare", "update"):
            check_keys(
                f"hardware.host.{phase}",
                getattr(self, phase),
                (f.name for f in dataclasses.fields(PhaseCost)),
                lambda v: math.isfinite(v) and v >= 0,
                ">= 0 and finite",
            )
        check_non_negative(
            "hardware.host",
            self,
            (*HOST_TIMES_US, "stall_every_steps", "graph_first_replay_us_per_kernel"),
        )


@dataclass
class GpuSpread:
    """The GPU model's own error, for the bands (cbsim/bands.py): not a cost, so calibration's
    forward fit does not see it (a nested group, not a term of GpuCosts)."""

    # the forward model's error on runs it was not fitted on, the standard deviation of log
    # (recorded / simulated) time: a band draws forward_scale from it per draw, beside the host
    # speed. 0 = the GPU model taken as exact (the band is the host's spread only)
    forward_error: float = 0.0
    # every forward's time times this (1 = as modelled): a band's draw sets it
    forward_scale: float = 1.0

    def __post_init__(self) -> None:
        check_range("hardware.gpu.spread.forward_error", self.forward_error, 0.0, 1.0)
        check_range("hardware.gpu.spread.forward_scale", self.forward_scale, 1e-3, 1e3)


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
    # GPU idle between two forwards queued back to back on the compute stream (the events
    # recorded around each forward, the next graph's or kernel's start on the device), us
    forward_gap_us: float = 0.0
    # kernels per transformer layer (eager launches / graph nodes)
    kernels_per_layer: int = 14
    # which build the kernel counts were taken on: "unfused" (cbsim's runtime without
    # mode.fuse_epilogues, the shipped H200 profiles' counts), "fused" (with it),
    # "fused_rope_kv" (with it and mode.fuse_rope_kv), "engine" (another engine's, used as
    # they are whatever the mode says); cbsim/costs/kernel_count.py adds or takes off what the
    # options fuse
    kernel_counts_of: str = "unfused"
    # kernels outside the layers (embedding, final norm, LM head, sampling)
    kernels_extra: int = 6
    # Kernels by the attention groups a step holds, on top of kernels_per_layer (0: one count
    # for every step). The runtime's counts (a diagnostic over the H200's recordings, Kineto,
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
    # per (request, kv head) walking the whole gathered table, one program per kv head in
    # parallel: besides FLOPs and bytes it takes this long per element each program walks, table
    # tokens x head_dim, of the widest continuation's table, per layer (the H200's long_prompt recording, 8B:
    # 2-7 rows against an 8208-token table added 15-30 ms to a 255 ms step; its 1b_8x8192 recording,
    # head_dim 64, 16 layers: 7-8 ms at 8192 tokens). 0 = none
    prefix_walk_us_per_element: float = 0.0
    # Launches the driver queues before cudaLaunchKernel blocks the host: an eager forward
    # whose kernels outrun the GPU by this many returns only as the GPU catches up (H200,
    # CUDA 13: 1021, a diagnostic over the H200's recordings: the 1022nd launch behind a sleeping
    # kernel blocked). A graph replay is one launch. 0 = unbounded
    launch_queue_depth: int = 0
    # GPU time of the in-graph carry-over scatter-add, microseconds
    carry_over_us: float = 3.0
    # GPU time per computed row (query token, a decode graph's padded rows included) on the
    # memory-bound side of the linear layers, beyond streaming weights and activations: skinny
    # GEMMs slow down with M (the H200's recordings, decode at batch 4, 8, 32: 7018 + 22.6 x rows + 0.0292 x KV
    # tokens us). Prefill is FLOP-bound, so it does not pay it. 0 = none
    gemm_row_us: float = 0.0
    # The split-K decode-attention kernel (runtime/kernels/paged_attention.py, pick_partition):
    # each (request, kv head, partition) program walks its partition's KV tiles one after another,
    # so besides the KV bytes the kernel takes this long per KV token of the longest walk, all
    # layers together: min(longest decode context, partition). The H200's seed_8192 recording: 0.038 us per
    # KV token below 4096 context, 0.020 above, where the partition (4096 tokens) splits in two.
    # 0 = attention bound by bytes and FLOPs only
    attention_walk_us_per_token: float = 0.0
    # The decode kernel reads only live KV but computes whole tiles (engine.decode_launch's
    # tile): this share of its time grows per tile, the rest per
    # token. A kernel table times contexts at tile multiples, where the two agree; between them
    # this share is charged at each context rounded up to its tile (the H200's recordings: the decode step's
    # residual is a sawtooth in context mod the tile, largest just past a multiple). 0 = per token
    attention_tile_share: float = 0.0
    # Every kernel-table time (GEMMs, elementwise, attention) times this: a table carries the
    # speed of the machine it was timed on, and machines of one kind differ (the H200 tables of
    # 2026-12-01 and -02, two machines: decode attention x1.009 median, p10-p90 0.975-1.024;
    # GEMMs 0.970-1.023). Calibration fits it on the recordings' machines; 1 = as timed
    kernel_table_scale: float = 1.0
    # The share falls as a tile's KV bytes over the batch grow (the kernel then bound by bytes,
    # per token): attention_tile_share / (1 + rows x kv heads x head_dim x tile x 2 x dtype bytes
    # / this), one layer. 0 = the same share at every batch
    attention_tile_share_bytes: float = 0.0
    # A compute stream that sat idle runs its next forward slower (clocks and caches cooling
    # down while the host works): the forward takes idle_slowdown us longer per us of idle before
    # it (sync vs async on the same batches: two H200 recordings +5..60 us after 0.3..1.5 ms of
    # idle, about 0.04 us per idle us; another about 1, as its forward span also holds the
    # 700 us graph launch). A threshold below which idling costs nothing (about 150 us in run1)
    # is not separable from forward_fixed_us in these recordings, so there is none. 0 = a
    # forward independent of what came before
    idle_slowdown: float = 0.0
    # Decode launches of at most this many programs (padded rows x kv heads x split-K
    # partitions) run in one wave: engine.decode_launch's target, two per SM of the H200's 132.
    # 0 = none counted as one wave
    decode_wave_programs: int = 0
    # A one-wave decode launch ends with its longest request, where a kernel table times even
    # contexts: its attention is charged this share of the way from the batch's mean context to
    # its longest (measured, not fitted: a diagnostic over the H200's recordings).
    # 0 = at the mean context, every launch
    decode_uneven_share: float = 0.0
    spread: GpuSpread = field(default_factory=GpuSpread)
    # the SM clock under sustained GEMM load (the power limit); a nested group: not a fitted term
    clock: GpuClock = field(default_factory=GpuClock)

    def __post_init__(self) -> None:
        check_keys(
            "hardware.gpu",
            self,
            (
                "gemm_bandwidth_eff",
                "gemm_flops_eff",
                "attention_bandwidth_eff",
                "attention_flops_eff",
            ),
            lambda v: 0.0 < v <= 1.0,
            "> 0 and <= 1",
        )
        check_positive("hardware.gpu.attention_kv_pad", self.attention_kv_pad)
        check_positive("hardware.gpu.kernels_per_layer", self.kernels_per_layer)
        check_choice("hardware.gpu.kernel_counts_of", self.kernel_counts_of, KERNEL_COUNTS_OF)
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
        check_range("hardware.gpu.attention_tile_share", self.attention_tile_share, 0.0, 1.0)
        check_range("hardware.gpu.kernel_table_scale", self.kernel_table_scale, 0.1, 10.0)
        check_range("hardware.gpu.decode_wave_programs", self.decode_wave_programs, 0, 1 << 20)
        check_range("hardware.gpu.decode_uneven_share", self.decode_uneven_share, 0.0, 1.0)
        check_non_negative(
            "hardware.gpu",
            self,
            (
                "gemm_row_us",
                "attention_walk_us_per_token",
                "idle_slowdown",
                "prefix_walk_us_per_element",
                "attention_tile_share_bytes",
            ),
        )


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
    # the simulator's own error on held-out runs, added to the bands' draws
    model_error: ModelError = field(default_factory=ModelError)
    # A kernel table (a CSV of +experiment=profile_kernels, or a directory of them; relative
    # paths are tried against the working directory, then the repository root): the forward's
    # GEMMs, elementwise kernels, decode attention and prompt-start attention, and the pinned
    # copies when it timed them, are costed from its measured times instead of the roofline and
    # copy_latency_us / *_bandwidth; gemm_row_us and attention_walk_us_per_token (effects the table
    # measures) are not added. null = the roofline (cbsim/costs/model.py)
    kernel_table: str | None = None
    # where these numbers came from, for the report
    source: str = "datasheet and measurements on the H200 here (BRIEF)"
    # the GPU the profile describes, matched case-insensitively as a part of torch's device name
    # ("H200" matches "NVIDIA H200"); empty: any. hardware=auto picks by it
    device_name: str = ""
    # how the numbers were had (TIERS): profiled (one command on that GPU), fitted (calibrated on
    # its recordings), datasheet (scaled from a profiled GPU), estimate (first guesses)
    tier: str = "estimate"
    # where each value came from, by its dotted key ("gpu.attention_tile_share"): measured
    # (where), fitted (on what, at what residual) or kept; +experiment=calibrate and
    # profile_machine write one entry per value, carrying the base's for the values they keep
    provenance: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_choice("hardware.tier", self.tier, PROFILE_TIERS)
        for key in (
            "peak_flops",
            "hbm_bandwidth",
            "memory_bytes",
            "h2d_bandwidth",
            "d2h_bandwidth",
        ):
            check_positive(f"hardware.{key}", getattr(self, key))
        check_non_negative("hardware", self, ("copy_latency_us",))
        check_choice("hardware.tier", self.tier, TIERS)
        if self.kernel_table is not None:
            files = kernel_table_files(self.kernel_table, self.name)
            root = shipped_root(self.name)
            if root is not None and all(root in f.parents for f in files):
                # a shipped profile's own tables: named absolutely, wherever the run starts
                self.kernel_table = str(root / self.kernel_table)
