"""mode.split_argmax: the two-stage argmax equals torch's, ties to the first maximum included."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from conftest import run_in_triton_interpreter

from cbsim.runtime.kernels.paged_attention import triton_available
from cbsim.runtime.kernels.sampling import ARGMAX_CHUNK, argmax_rows

REPO = Path(__file__).resolve().parents[1]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def tied_logits(rows: int, vocab: int, dtype, device="cpu", seed=0) -> torch.Tensor:
    """Random logits whose maximum some rows hold twice: inside one chunk, in two chunks, at the
    vocabulary's last index, and a row of one repeated value."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g).to(dtype)
    top = x.float().max().item() + 1
    plants = [(5, 7), (3, ARGMAX_CHUNK + 3), (vocab - 1, 1), (ARGMAX_CHUNK - 1, ARGMAX_CHUNK)]
    for r, cols in zip(range(rows), plants):
        for c in cols:
            x[r, min(c, vocab - 1)] = top
    if rows > len(plants):
        x[len(plants)] = 0.5  # every index ties: the first wins
    return x.to(device)


def test_falls_back_to_torch_on_cpu():
    x = tied_logits(6, 3 * ARGMAX_CHUNK + 17, torch.bfloat16)
    out = torch.empty(6, dtype=torch.int64)
    argmax_rows(x, out)
    assert torch.equal(out, x.argmax(-1))
    assert out[0] == 5 and out[1] == 3 and out[4] == 0


@pytest.mark.slow
@pytest.mark.skipif(not triton_available(), reason="triton not installed")
def test_split_argmax_in_interpreter():
    script = textwrap.dedent(
        f"""
        import sys, torch
        sys.path.insert(0, {str(REPO)!r}); sys.path.insert(0, {str(REPO / "tests")!r})
        from runtime.kernels.sampling import argmax_rows
        from test_sampling_kernel import tied_logits
        for rows, vocab in ((6, 9000), (1, 4096), (3, 100)):
            x = tied_logits(rows, vocab, torch.float32)
            out = torch.empty(rows, dtype=torch.int64)
            argmax_rows(x, out)
            assert torch.equal(out, x.argmax(-1)), (rows, vocab, out, x.argmax(-1))
        print("ok")
        """
    )
    run_in_triton_interpreter(script)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,vocab", [(1, 128256), (7, 151936), (32, 128256), (300, 5000)])
def test_split_argmax_on_cuda(dtype, rows, vocab):
    x = tied_logits(rows, vocab, dtype, "cuda", seed=rows)
    out = torch.full((rows,), -1, dtype=torch.int64, device="cuda")
    argmax_rows(x, out)
    assert torch.equal(out, x.argmax(-1))


@pytest.mark.gpu
@needs_cuda
def test_split_argmax_graph_capture():
    x = tied_logits(32, 128256, torch.bfloat16, "cuda")
    out = torch.full((32,), -1, dtype=torch.int64, device="cuda")
    argmax_rows(x, out)  # compile outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        argmax_rows(x, out)
    x.copy_(tied_logits(32, 128256, torch.bfloat16, "cuda", seed=3))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, x.argmax(-1))
