"""The rotation a runtime layer defers from transformers' rotary call to its attention
(``mode.fuse_rope_kv``; runtime/kernels/rope_kv.py runs it).

transformers' attention rotates q and k, then hands them to the attention function, which writes
k and v into the paged cache: two kernels of tiny work in every layer. Inside a runtime layer
(``arm``ed by the fused layer forward, where the step's batch metadata is) the rotary wrapper
keeps cos/sin here and hands q and k back unrotated (``defer``); the attention function takes
them (``take``) and one kernel rotates q and k as it writes the cache. Outside a runtime layer
(transformers' own generate, another attention function) nothing is deferred.
"""

from __future__ import annotations

import torch


class _Deferred:
    """The pending rotation: armed inside a runtime layer, cos/sin once deferred."""

    armed = False
    cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None


_STATE = _Deferred()


def arm(on: bool) -> None:
    """Let the rotary wrapper defer the rotation to the attention function (a runtime layer
    arms it around its attention and disarms it after, even on an error)."""
    _STATE.armed, _STATE.cos_sin = on, None


def defer(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Keep cos/sin for the attention function when a runtime layer armed it and the one kernel
    takes the tensors (batch 1; the caller checked the rest); False: rotate now."""
    if not _STATE.armed or _STATE.cos_sin is not None or q.shape[0] != 1 or cos.shape[0] != 1:
        return False
    _STATE.cos_sin = (cos, sin)
    return True


def take() -> tuple[torch.Tensor, torch.Tensor] | None:
    """The deferred cos/sin of this layer (once), or None when q and k came rotated."""
    got, _STATE.cos_sin = _STATE.cos_sin, None
    return got
