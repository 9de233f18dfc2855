"""Warm-up before the timed loop: every library set-up, kernel choice, Triton compile and
allocator growth that a step can trigger happens here, so the loop's first steps cost what later
ones do."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from .io_slots import dummy_decode, dummy_prefill, empty_decode_layout
from .kernels.fused_epilogues import _residual_linear_forward
from .kernels.fused_projections import FusedLinear
from .kernels.paged_attention import compiled_variants
from .runner import ModelRunner
from .streams import Streams


def warm_up(runner: ModelRunner, streams: Streams, steps: int, prefill_tokens: int) -> None:
    """Eager forwards on padding-only batches, `steps` times each: a decode batch of the largest
    size and a prompt chunk of `prefill_tokens` (from position 0, and after a cached prefix)."""
    rows = runner.max_outputs
    dec = empty_decode_layout(rows, runner.graph_width, runner.carry_len)
    dec_flat = dummy_decode(dec, runner.cache.scratch_block, runner.block_size)
    prefills = [
        dummy_prefill(
            prefill_tokens, runner.block_size, runner.cache.scratch_block, runner.carry_len, fresh
        )
        for fresh in (True, False)
    ]
    if streams.cuda:
        torch.cuda.set_stream(streams.compute)
    try:
        if runner.decode_kernel is not None:
            compile_decode_variants(runner)
        if streams.cuda and runner.token_multiple > 1:
            warm_gemm_shapes(runner, runner.max_tokens)
        for _ in range(steps):
            for flat, layout in ((dec_flat, dec), *prefills):
                slot = runner.slots[0]
                slot.dev_in[: flat.size].copy_(torch.from_numpy(flat).to(runner.device))
                runner.step_body(slot, layout)
    finally:
        if streams.cuda:
            torch.cuda.synchronize()
            torch.cuda.set_stream(torch.cuda.default_stream())


def compile_decode_variants(runner: ModelRunner) -> None:
    """Run the decode kernel once per variant an eager step can reach (mixed steps: any number
    of decode rows up to the batch, any table width up to the longest request), so no Triton
    compile lands inside the timed loop."""
    cache, s = runner.cache, runner.shape
    kc, vc = cache.k[0], cache.v[0]
    hq = s["num_heads"]
    for rows, width in compiled_variants(
        runner.max_decode_rows,
        s["num_kv_heads"],
        runner.graph_width,
        runner.block_size,
        runner.launch_rule,
    ):
        q = torch.zeros(rows, hq, s["head_dim"], dtype=kc.dtype, device=runner.device)
        bt = torch.full((rows, width), cache.scratch_block, dtype=torch.int32, device=runner.device)
        ctx = torch.ones(rows, dtype=torch.int32, device=runner.device)
        runner.decode_kernel(q, kc, vc, bt, ctx, 1.0)


@torch.inference_mode()
def warm_gemm_shapes(runner: ModelRunner, max_tokens: int) -> None:
    """Every GEMM shape an eager step can reach, once: the layers' at each padded token count
    up to ``max_tokens``, the LM head's at each count of sampled rows. cuBLAS chooses its kernel
    the first time it meets a shape, 0.3-2.7 ms of host time inside the step that meets it
    (a diagnostic over the H200's recordings), which would land in whichever engine runs first."""
    model, m = runner.model, runner.token_multiple
    head = model.get_output_embeddings()
    layers: dict[tuple, tuple] = {}
    for module in model.modules():
        if module is head or not isinstance(module, (nn.Linear, FusedLinear)):
            continue
        into = isinstance(module.forward, functools.partial)
        into = into and module.forward.func is _residual_linear_forward
        w, b = module.weight, module.bias
        layers.setdefault((tuple(w.shape), w.dtype, b is None, into), (w, b, into))
    # one contiguous input per width, as the layers' inputs are (cuBLAS keys on the strides too)
    dtype, dev = head.weight.dtype, runner.device
    widths = {w.shape[1] for w, _, _ in layers.values()} | {head.weight.shape[1]}
    rows_max = max(max_tokens, runner.max_outputs)
    x = {k: torch.zeros(rows_max, k, dtype=dtype, device=dev) for k in widths}
    for rows in range(m, max_tokens + 1, m):
        for w, b, into in layers.values():
            xs = x[w.shape[1]][:rows]
            if into:  # o_proj and down_proj add into the residual (fused_epilogues.py)
                torch.zeros(rows, w.shape[0], dtype=w.dtype, device=w.device).addmm_(xs, w.t())
            else:
                F.linear(xs, w, b)
    for rows in range(1, runner.max_outputs + 1):
        F.linear(x[head.weight.shape[1]][:rows], head.weight, head.bias)
