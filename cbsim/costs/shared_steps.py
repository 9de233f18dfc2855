"""A decode step's kernel-table terms (its layers', LM head's and attention's microseconds),
remembered across the simulations of one configuration.

A decode step's terms follow from its requests' contexts and its padding alone, under GPU terms
that no host cost and no band draw's forward scale moves: a validation simulates each recorded
run ten times (its prediction and its band's draws; repeated recordings of one workload once
each), and a run without arrivals takes the same steps every time. A simulator's CostModel
(``share_steps``) keeps them here, under a scope that is its whole configuration but the host's
costs and the GPU's spread (which the terms do not read) and its kernel lookups.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# configurations kept, and steps kept over all of them (past either, all are forgotten at once:
# a step's key holds its contexts, 8 bytes a request)
MAX_SCOPES = 64
MAX_STEPS = 1 << 16

Terms = tuple[float, float, float]
_SCOPES: dict[str, tuple[Any, dict[tuple, Terms]]] = {}
_kept = 0  # steps in every scope's dict


def decode_terms(config: Any, kernel_costs: Any, max_context: int) -> dict[tuple, Terms]:
    """The terms kept for this configuration's decode steps (a dict the CostModel fills)."""
    scope = _scope(config, kernel_costs, max_context)
    entry = _SCOPES.get(scope)
    if entry is None or entry[0] is not kernel_costs:
        if len(_SCOPES) >= MAX_SCOPES:
            _forget()
        entry = _SCOPES[scope] = (kernel_costs, {})
    return entry[1]


def remember(memo: dict[tuple, Terms], key: tuple, terms: Terms) -> None:
    global _kept
    if _kept >= MAX_STEPS:
        _forget()
    memo[key] = terms
    _kept += 1


def _forget() -> None:
    """Every scope emptied (a CostModel still holding one keeps an empty dict) and dropped."""
    global _kept
    for _, memo in _SCOPES.values():
        memo.clear()
    _SCOPES.clear()
    _kept = 0


def _scope(config: Any, kernel_costs: Any, max_context: int) -> str:
    """Every value of the configuration but the host's costs and the GPU's spread, as text
    (dataclass reprs list every field), with the kernel lookups' identity (kept alive by the
    scope, so no other takes it)."""
    hw = config.hardware
    gpu = [(f.name, getattr(hw.gpu, f.name)) for f in dataclasses.fields(hw.gpu)]
    rest = [(f.name, getattr(hw, f.name)) for f in dataclasses.fields(hw)]
    gpu = [item for item in gpu if item[0] != "spread"]
    rest = [item for item in rest if item[0] not in ("host", "gpu")]
    parts = (config.model, config.mode, config.engine, config.workload, gpu, rest)
    return repr((id(kernel_costs), max_context, *parts))
