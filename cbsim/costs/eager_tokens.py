"""The token rows an eager forward computes, in both back ends (engine.eager_token_multiple).

cuBLAS chooses a GEMM's kernel the first time the process meets its shape, 0.3-2.7 ms of host
time a shape on the H200 (a diagnostic over the H200's recordings): a mixed step of a new token
count paid 4-10 ms more, in whichever engine of a comparison ran first. Rounding a step's token
count up to a multiple leaves a run few shapes, which the runtime's warm-up runs once each; the
padding rows go through the layers (the simulator charges them too) and write only the scratch
block.
"""

from __future__ import annotations


def round_up(tokens: int, multiple: int) -> int:
    return -(-tokens // multiple) * multiple if multiple > 1 else tokens


def eager_tokens(batch, multiple: int) -> int:
    """A step with prompt tokens rounded up to ``multiple``; a step of one token per request as
    it is (its rows are its requests: a graph or the decode path runs it)."""
    t = int(batch.query_tokens)
    return t if t == len(batch) else round_up(t, multiple)
