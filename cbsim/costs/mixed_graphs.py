"""Steps with prompt tokens replayed from CUDA graphs over token buckets (engine.mixed_graphs).

The runtime implements both kinds (runtime/piecewise.py, runtime/full_graphs.py: the same
buckets), on CUDA and in the tests' CPU emulation; tests/test_runtime_gpu.py checks on a GPU that
their replay gives the eager steps' tokens.

``buckets``: the piecewise replay that serving engines run for prefill and mixed steps (vLLM's
default ``cudagraph_mode`` FULL_AND_PIECEWISE, SGLang's piecewise CUDA graph runner,
TensorRT-LLM's piecewise graphs): the forward is split at attention, each piece between two
attentions (o_proj, residual, norms, the MLP, the next layer's q/k/v and RoPE) is a graph captured
per token-count bucket, and attention runs eagerly between the pieces over the step's real rows.
A graphed step (CostModel.forward with ``padded_tokens``, sim/launch.py):
- the host launches ``layers + 1`` pieces (hardware.host.graph_launch_us each, the first
  replay of each (slot, bucket) graph_first_replay_us_per_kernel per node) and, eagerly at
  kernel_launch_us each, the attention kernels of the step's groups (kernel_count.py's per-group
  counts: what ``step_kernels`` adds beyond the layers' own kernels);
- the GPU runs the pieces' kernels over the bucket's rows (padding rows go through the GEMMs
  and elementwise kernels, as in the engines) with graph_node_gap_us between them, and the
  attention kernels over the real rows with eager_kernel_gap_us; its GEMMs on mode.blas (the
  library the runtime's eager steps use, fixed at capture), not mode.graph_blas;
- the carry-over scatter is captured in the first piece, as in a decode graph.

``full``: the whole forward is one graph per bucket, attention included: one varlen kernel over
the step's sequences as fixed-capacity metadata (vLLM's FULL mode with a backend that takes mixed
batches), reading only live rows and live KV. The host launches one graph, as for a decode step;
the GPU runs every kernel with the node gap. Its attention is priced by the kernel tables of the
eager groups (decode rows, prompt starts, continuations), the kernels a profile measures.

Buckets are derived, not configured: ``eager_token_multiple`` times 1, 2, 3, 4, 6, 8, 12, ...
(two per octave, the ladder of engine.graph_batch_sizes), up to the first that holds
workload.max_batch_tokens. Each bucket is a multiple of the eager multiple, so every captured
shape is one the eager path already warms up, and a step pads by less than half. A step longer
than the largest bucket (chunked prefill off) runs eagerly, and with engine.cuda_graphs=false
every step does.
"""

from __future__ import annotations

from cbsim.costs.eager_tokens import round_up
from cbsim.costs.forward_cost import ForwardCost
from cbsim.costs.kernel_count import step_kernels


def mixed_graphs_mode(config) -> str:
    """engine.mixed_graphs as the run takes it: "auto" is "full" where the runtime replays CUDA
    graphs with its Triton attention inside them (a CUDA device, engine.cuda_graphs on,
    mode.attention not torch), else "off"; the runtime also turns it off where Triton cannot
    load (runtime/engine.py), and records what it ran (otherData.mixed_graphs)."""
    mode = config.engine.mixed_graphs
    if mode != "auto":
        return mode
    cuda = not str(config.mode.device).startswith("cpu")
    graphs = cuda and config.engine.cuda_graphs and config.mode.attention != "torch"
    return "full" if graphs else "off"


def buckets_of(config) -> list[int]:
    """The run's token buckets; [] when steps with prompt tokens run eagerly."""
    if mixed_graphs_mode(config) == "off":
        return []
    return token_buckets(config.engine.eager_token_multiple, config.workload.max_batch_tokens)


def token_buckets(multiple: int, max_tokens: int) -> list[int]:
    """The captured token counts: ``multiple`` x (1, 2, 3, 4, 6, 8, ...) up to the first at or
    past ``max_tokens``."""
    top = round_up(max(max_tokens, 1), multiple)
    steps, k = [1], 2
    while steps[-1] * multiple < top:
        steps.append(k)
        k = k * 3 // 2 if k & (k - 1) == 0 else k * 4 // 3
    return [min(s * multiple, top) for s in steps]


def bucket_of(buckets: list[int], tokens: int) -> int | None:
    """The smallest bucket that holds ``tokens``; None: past the largest (eager)."""
    for b in buckets:
        if b >= tokens:
            return b
    return None


def attention_kernels(gpu, layers: int, groups) -> int:
    """The kernels a piecewise replay leaves to the host: the attention of each of the step's
    groups (decode rows, prompt starts, continuations), per layer and once per forward."""
    return step_kernels(gpu, 0, layers, groups)


def piecewise(cost: ForwardCost, gpu, layers: int, groups) -> None:
    """Make ``cost`` (priced as one graph over the bucket) a piecewise replay: its pieces, and
    its attention kernels launched between them, each with the eager gap, not the node gap."""
    cost.pieces = layers + 1
    cost.eager_kernels = attention_kernels(gpu, layers, groups)
    extra_gap = (gpu.eager_kernel_gap_us - gpu.graph_node_gap_us) * cost.eager_kernels
    cost.overhead_us += extra_gap * gpu.spread.forward_scale


def piece_activation_bytes(model, tokens: int) -> int:
    """The pieces' activation workspace at ``tokens`` rows (hidden states, q/k/v, MLP
    intermediates in the model dtype), shared by every bucket's pieces in the graph pool."""
    h, kv = model.hidden_size, model.num_kv_heads * model.head_dim
    return tokens * model.dtype_bytes * (6 * h + 2 * kv + 3 * model.intermediate_size)
