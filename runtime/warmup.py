"""Warm-up before the timed loop: every library set-up, kernel choice, Triton compile and
allocator growth that a step can trigger happens here, so the loop's first steps cost what later
ones do."""

from __future__ import annotations

import torch

from .io_slots import dummy_decode, dummy_prefill, empty_decode_layout
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
        runner.max_outputs,
        s["num_kv_heads"],
        runner.graph_width,
        runner.block_size,
        runner.launch_rule,
    ):
        q = torch.zeros(rows, hq, s["head_dim"], dtype=kc.dtype, device=runner.device)
        bt = torch.full((rows, width), cache.scratch_block, dtype=torch.int32, device=runner.device)
        ctx = torch.ones(rows, dtype=torch.int32, device=runner.device)
        runner.decode_kernel(q, kc, vc, bt, ctx, 1.0)
