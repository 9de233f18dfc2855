"""CostModel's view of a step that no GPU term moves: its attention groups, the decode kernel's
rows, block table, tile and launch, and the contexts of its decode rows. Each is worked out once
per batch and kept in a ``StepMemo``: the last batch's in a simulation, where the forward, the
launch and the copy of a step all ask; every sampled step's in a fit, which costs the same steps
under hundreds of sets of GPU terms (CostModel's ``like``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from cbsim.costs.attention_groups import AttentionGroups, groups_of
from cbsim.costs.decode_kernel import launch_name, table_width
from cbsim.costs.kernels import DecodeRows


class StepMemo:
    """Values computed from a batch, kept for the last ``size`` batches. A batch is known by its
    identity, and held while kept, so no other object can take its id."""

    def __init__(self, size: int = 1) -> None:
        self.size = size
        self._by_id: dict[int, tuple[object, dict[Any, Any]]] = {}

    def get(self, batch, key, make: Callable[[], Any]) -> Any:
        entry = self._by_id.get(id(batch))
        if entry is None or entry[0] is not batch:
            if len(self._by_id) >= self.size:
                self._by_id.clear()
            entry = self._by_id[id(batch)] = (batch, {})
        values = entry[1]
        if key not in values:
            values[key] = make()
        return values[key]


class StepTables:
    """CostModel's per-step shapes (it sets ``rule``, ``graph_tables``, ``kv_heads``,
    ``block_size``, ``short_max``, ``workload``, ``model``, ``gpu``, ``memo``, ``_partitions``
    and ``_max_context``)."""

    @property
    def max_context(self) -> int:
        if self._max_context is None:
            w = self.workload
            if w.prompt_dist == "fixed" and w.gen_dist == "fixed":
                self._max_context = w.prompt_len + w.gen_len
            else:
                from cbsim.workload import make_requests

                reqs = make_requests(w, self.model.vocab_size)
                self._max_context = max(r.prompt_len + r.max_new_tokens for r in reqs)
        return self._max_context

    def partition(self, rows: int, width: int | None = None) -> int:
        """The decode kernel's split-K partition for ``rows`` over a table ``width`` tokens wide
        (None: the longest request's)."""
        width = table_width(self.max_context, self.block_size) if width is None else width
        key = (rows, width)
        if key not in self._partitions:
            self._partitions[key] = self.rule.partition(rows, self.kv_heads, width)
        return self._partitions[key]

    def graph_table(self, rows: int, longest: int) -> int:
        """Tokens of the block table a graph of ``rows`` requests replays with for a step whose
        longest request has ``longest`` (runtime/runner.py)."""
        widest = table_width(self.max_context, self.block_size)
        return self.graph_tables.width(rows, longest, widest)

    def decode_table(self, batch, padded: int | None) -> tuple[int, int]:
        """(rows, table width) the decode kernel launches over: a graph step's ``padded`` rows
        over its replayed table, an eager step's decode rows over a table as wide as the
        batch's longest request (io_slots.pack)."""
        return self.memo.get(batch, ("table", padded), lambda: self._decode_table(batch, padded))

    def _decode_table(self, batch, padded: int | None) -> tuple[int, int]:
        longest = int(batch.context_lens.max())
        if padded is not None:
            return padded, self.graph_table(padded, longest)
        rows = self.groups(batch).decode_rows
        return max(rows, 1), table_width(longest, self.block_size)

    def uneven_share(self, batch, padded: int | None) -> float:
        """hardware.gpu.decode_uneven_share where the step's decode launch runs in one wave."""
        g = self.gpu
        if not (g.decode_uneven_share and g.decode_wave_programs):
            return 0.0
        rows, width = self.decode_table(batch, padded)
        programs = rows * self.kv_heads * -(-width // self.partition(rows, width))
        return g.decode_uneven_share if programs <= g.decode_wave_programs else 0.0

    def groups(self, batch) -> AttentionGroups:
        """The step's attention groups, as the runtime packs them (attention_groups.py), which
        the forward's terms and the step's copy all read."""
        return self.memo.get(batch, "groups", lambda: groups_of(batch, self.short_max))

    def decode_rows(self, batch, decode: bool) -> DecodeRows | None:
        """The contexts of the step's decode rows (None: it has none)."""
        if decode:
            return self.memo.get(batch, "rows", lambda: DecodeRows(np.asarray(batch.context_lens)))
        groups = self.groups(batch)
        if not groups.decode_rows:
            return None
        return self.memo.get(batch, "mixed rows", lambda: DecodeRows(groups.dec_ctx))

    def decode_tile(self, batch, padded: int | None) -> int:
        return self.memo.get(
            batch, ("tile", padded), lambda: self.rule.tile(self.decode_table(batch, padded)[1])
        )

    def decode_launch(self, batch, padded: int | None) -> str:
        """The decode kernel's launch, as kernel tables name it."""
        return self.memo.get(batch, ("launch", padded), lambda: self._launch(batch, padded))

    def _launch(self, batch, padded: int | None) -> str:
        rows, width = self.decode_table(batch, padded)
        return launch_name(self.rule.tile(width), self.partition(rows, width), width)
