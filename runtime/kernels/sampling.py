"""Greedy sampling's argmax over the vocabulary in two short kernels (``mode.split_argmax``).

torch's argmax over the last dimension runs a program per row that walks the whole vocabulary:
26-27 us for 1 to 128 rows of 128K bf16 logits on the H200, a hundred times the bytes' time
(cbsim/kernel_tables/h200). Here each program takes one chunk of a row (its maximum and first
index), and a second kernel picks each row's first chunk holding the maximum, so the result is
torch's to the index (ties go to the first maximum). On tensors Triton cannot take (CPU, no
triton) it is torch's argmax.
"""

from __future__ import annotations

import functools

import torch

from .fused_elementwise import triton_ok
from .paged_attention import triton_next_pow2

ARGMAX_CHUNK = 4096  # logits per program of the first stage


@functools.cache
def _kernels():
    from . import _triton_sampling

    return _triton_sampling


def argmax_rows(logits: torch.Tensor, out: torch.Tensor, split: bool = True) -> None:
    """``out[i] = argmax(logits[i])`` for a [rows, vocab] ``logits``; ``split``: the two-stage
    kernels where Triton runs, else torch's one."""
    rows, vocab = logits.shape
    if not (split and rows and triton_ok(logits) and logits.stride(-1) == 1):
        out.copy_(logits.argmax(-1))
        return
    nchunk = -(-vocab // ARGMAX_CHUNK)
    val = torch.empty((rows, nchunk), dtype=torch.float32, device=logits.device)
    idx = torch.empty((rows, nchunk), dtype=torch.int64, device=logits.device)
    k = _kernels()
    k._argmax_chunks_kernel[(rows, nchunk)](
        logits, val, idx, logits.stride(0), vocab, nchunk, CHUNK=ARGMAX_CHUNK, num_warps=4
    )
    k._argmax_rows_kernel[(rows,)](
        val, idx, out, nchunk, BLOCK=max(triton_next_pow2(nchunk), 16), num_warps=1
    )
