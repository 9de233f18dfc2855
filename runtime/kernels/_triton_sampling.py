"""Triton kernels behind `sampling` (imported lazily: needs triton)."""

import triton
import triton.language as tl


@triton.jit
def _argmax_chunks_kernel(
    x_ptr, val_ptr, idx_ptr, stride_x, V, NCHUNK, CHUNK: tl.constexpr
):  # fmt: skip
    # one program per (row, chunk of the vocabulary): the chunk's maximum and its first index
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * stride_x + offs, mask=offs < V, other=float("-inf"))
    x = x.to(tl.float32)
    m = tl.max(x, axis=0)
    i = tl.argmax(x, axis=0, tie_break_left=True)
    tl.store(val_ptr + row * NCHUNK + c, m)
    tl.store(idx_ptr + row * NCHUNK + c, c * CHUNK + i)


@triton.jit
def _argmax_rows_kernel(val_ptr, idx_ptr, out_ptr, NCHUNK, BLOCK: tl.constexpr):
    # one program per row: the first chunk holding the row's maximum (chunks are in order, so
    # its first index is the row's first maximum, as torch.argmax returns)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    v = tl.load(val_ptr + row * NCHUNK + offs, mask=offs < NCHUNK, other=float("-inf"))
    j = tl.argmax(v, axis=0, tie_break_left=True)
    best = tl.load(idx_ptr + row * NCHUNK + j)
    tl.store(out_ptr + row, best.to(out_ptr.dtype.element_ty))
