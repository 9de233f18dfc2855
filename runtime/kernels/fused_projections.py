"""Fuse a transformers Llama model's q/k/v projections into one GEMM, and gate/up into one GEMM.

The layers' own forward code stays as it is: `LlamaAttention.forward` still calls `self.q_proj(x)`,
`self.k_proj(x)`, `self.v_proj(x)` and `LlamaMLP.forward` still calls `self.gate_proj(x)` and
`self.up_proj(x)`. Each of those attributes becomes a `FusedSlice` of one shared `FusedLinear` that
holds the concatenated weight: the first slice called with an input runs the single GEMM and keeps
its output; the others, called with the *same* tensor object, return their column slice of it (a
view, no copy). Called with another tensor, a slice recomputes, so the result is always right; the
saving needs only that the parts see one input object, which holds for transformers' Llama/Mistral/
Qwen2-style layers. Works under CUDA-graph capture (the caching is Python-side, at capture time).

At batch 32 an 8B decode step is weight-bandwidth bound; one GEMM reading [q;k;v] runs nearer the
copy bandwidth than three, the small k/v GEMMs being the least efficient (the H200 benchmarks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class FusedLinear(nn.Module):
    """One linear layer whose output columns are the concatenation of several original layers'."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, sizes: list[int]):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.sizes = list(sizes)
        self._input: torch.Tensor | None = None
        self._parts: tuple[torch.Tensor, ...] = ()
        self._served = 0

    def part(self, x: torch.Tensor, index: int) -> torch.Tensor:
        if self._input is not x:
            self._parts = torch.split(F.linear(x, self.weight, self.bias), self.sizes, dim=-1)
            self._input = x
            self._served = 0
        out = self._parts[index]
        self._served += 1
        if self._served >= len(self.sizes):  # every part handed out: drop the references
            self._input, self._parts, self._served = None, (), 0
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.weight.shape[1]}, out_features={self.sizes}"


class FusedSlice(nn.Module):
    """Stands in for one of the original linear layers: part `index` of a FusedLinear's output."""

    def __init__(self, fused: FusedLinear, index: int, in_features: int, out_features: int):
        super().__init__()
        # A plain attribute, not a submodule: the parameters are registered once, on the parent.
        object.__setattr__(self, "_fused", fused)
        self.index = index
        self.in_features = in_features
        self.out_features = out_features

    @property
    def weight(self) -> torch.Tensor:
        """This part's rows of the fused weight (a view), for code that inspects `.weight`."""
        start = sum(self._fused.sizes[: self.index])
        return self._fused.weight[start : start + self.out_features]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._fused.part(x, self.index)

    def extra_repr(self) -> str:
        return (
            f"part={self.index}, in_features={self.in_features}, out_features={self.out_features}"
        )


def fuse_linears(owner: nn.Module, names: list[str], fused_name: str) -> FusedLinear:
    """Replace `owner.<name>` for each name by a slice of one new `owner.<fused_name>`."""
    linears = [getattr(owner, n) for n in names]
    if not all(isinstance(lin, nn.Linear) for lin in linears):
        raise TypeError(f"{type(owner).__name__}.{names} must all be nn.Linear to fuse")
    in_features = {lin.in_features for lin in linears}
    if len(in_features) != 1:
        raise ValueError(f"{names} read different input sizes {sorted(in_features)}")
    has_bias = {lin.bias is not None for lin in linears}
    if len(has_bias) != 1:
        raise ValueError(f"{names}: some have a bias and some do not")
    with torch.no_grad():
        weight = torch.cat([lin.weight for lin in linears], dim=0)
        bias = torch.cat([lin.bias for lin in linears]) if has_bias.pop() else None
    sizes = [lin.out_features for lin in linears]
    fused = FusedLinear(weight, bias, sizes)
    owner.add_module(fused_name, fused)
    for i, (n, lin) in enumerate(zip(names, linears)):
        delattr(owner, n)  # frees the original weight once nothing else holds it
        setattr(owner, n, FusedSlice(fused, i, lin.in_features, lin.out_features))
    return fused


def fuse_qkv_and_gate_up(model: nn.Module, *, qkv: bool = True, gate_up: bool = True) -> int:
    """Fuse, in place, every attention block's q/k/v_proj (into `qkv_proj`) and every MLP's
    gate/up_proj (into `gate_up_proj`). Returns the number of fused groups. Call it after the
    weights are loaded; the state dict then holds the fused names instead of the original ones."""
    count = 0
    for module in list(model.modules()):
        if qkv and all(
            isinstance(getattr(module, n, None), nn.Linear) for n in ("q_proj", "k_proj", "v_proj")
        ):
            fuse_linears(module, ["q_proj", "k_proj", "v_proj"], "qkv_proj")
            count += 1
        if gate_up and all(
            isinstance(getattr(module, n, None), nn.Linear) for n in ("gate_proj", "up_proj")
        ):
            fuse_linears(module, ["gate_proj", "up_proj"], "gate_up_proj")
            count += 1
    return count
