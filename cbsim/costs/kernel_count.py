"""How many kernels a forward runs (graph nodes when replayed): the runtime's counts
(hardware.gpu.*kernels*, counted by Kineto on the H200, a diagnostic over the H200's recordings): the
layers' own kernels, plus those of each attention group a step holds (decode rows, prompt chunks
from position 0, chunks after a cached prefix) and the kernels once per forward.

Each kernel pays one gap (hardware.gpu.graph_node_gap_us or eager_kernel_gap_us), kernel table
or not: a table's kernel is timed back to back with copies of itself, and inside the forward,
between kernels of other kinds, it measurably costs more. Charging the gap only to the kernels
the table does not time (the per-forward extras) made the held-out model shapes worse
(the H200's recordings, model holdout: the 1B's async decode +2..+3% -> +5..+9%, the 8B's further short):
the recorded steps grow with the layers by about a gap per kernel beyond the table's times.
"""

from __future__ import annotations

# What mode.fuse_epilogues removes, read off the runtime's code (runtime/kernels/fused_epilogues.py)
# and counted by Kineto on the H200 (an H200 benchmark: 565 -> 437 nodes an 8B decode
# graph): per layer, the two residual adds (the o_proj and down GEMMs add into the residual), one
# of SiLU and the multiply, one of the K and V cache writes
FUSED_LAYER_KERNELS_SAVED = 4
# and mode.fuse_rope_kv on top of it: RoPE inside the K/V write (runtime/kernels/rope_kv.py)
ROPE_KV_KERNELS_SAVED = 1
# the build (fuse_epilogues, fuse_rope_kv) each hardware.gpu.kernel_counts_of names
COUNTED_BUILDS = {"unfused": (False, False), "fused": (True, False), "fused_rope_kv": (True, True)}


def saved_kernels(fused_epilogues: bool, rope_kv: bool) -> int:
    """Kernels per layer the simulated build's fusions save against the unfused build."""
    if not fused_epilogues:
        return 0
    return FUSED_LAYER_KERNELS_SAVED + (ROPE_KV_KERNELS_SAVED if rope_kv else 0)


def layer_kernels(gpu, fused_epilogues: bool, rope_kv: bool = False) -> int:
    """The layers' own kernels per layer for the simulated build: the profile's count, moved by
    what the fusions remove where it was counted on another build (hardware.gpu.kernel_counts_of;
    another engine's counts are used as they are), and at least one."""
    if gpu.kernel_counts_of == "engine":
        return gpu.kernels_per_layer
    counted = saved_kernels(*COUNTED_BUILDS[gpu.kernel_counts_of])
    delta = counted - saved_kernels(fused_epilogues, rope_kv)
    return max(1, gpu.kernels_per_layer + delta)


def step_kernels(gpu, base: int, layers: int, groups) -> int:
    """Kernels of one forward: ``base`` (the layers' own and the per-forward ones), plus those of
    each attention group the step holds (``groups``: its AttentionGroups, None for a decode-only
    step; the runtime's groups, runtime/attention.py)."""
    if groups is None or not (len(groups.fresh) or len(groups.ext)):
        return base + gpu.decode_kernels_per_layer * layers
    n = base
    if groups.decode_rows:
        n += gpu.decode_kernels_per_layer * layers
    if len(groups.fresh):
        n += gpu.prefill_kernels_per_layer * layers + gpu.prefill_kernels_extra
    if len(groups.ext):
        n += gpu.prefix_kernels_per_layer * layers + gpu.prefix_kernels_extra
    return n
