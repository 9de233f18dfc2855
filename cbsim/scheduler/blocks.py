"""The requests' block tables: one flat int32 array of block ids, a segment per admission.

A request admitted gets a segment long enough for every block it can ever hold (its prompt +
max_new_tokens - 1 KV entries) and its blocks are written there as they are granted; segments
are never reused and a grown array is a new one, so a batch's views of the table stay valid
after later ``schedule`` calls. The blocks themselves come from the KVBlockManager, the one
owner of KV blocks; each row's segment and count live in the request table (``seg``, ``nblk``).
"""

from __future__ import annotations

import numpy as np

from cbsim.kv_blocks import KVBlockManager
from cbsim.scheduler.table import RequestTable


class BlockTables:
    """The flat block table over the KV cache of ``kv``, rows in ``table``."""

    def __init__(self, kv: KVBlockManager, table: RequestTable) -> None:
        self.kv = kv
        self.table = table
        self.flat = np.zeros(1024, dtype=np.int32)
        self.top = 0

    def open(self, i: int, need: int) -> None:
        """Admit row ``i``: a new segment, its first ``need`` blocks granted."""
        t = self.table
        cap = self.kv.blocks_needed(int(t.plen[i] + t.maxnew[i]) - 1)
        top = self.top
        if top + cap > self.flat.size:
            new = np.zeros(max(2 * self.flat.size, top + cap), dtype=np.int32)
            new[:top] = self.flat[:top]
            self.flat = new  # batches keep the old array, which still holds their blocks
        t.seg[i] = top
        self.top = top + cap
        self.flat[top : top + need] = self.kv.allocate(need)
        t.nblk[i] = need

    def grant(self, sel: np.ndarray, need: np.ndarray, total: int, nblk: np.ndarray) -> None:
        """Allocate ``need[j]`` more blocks to row ``sel[j]`` (same order); ``nblk`` are the
        rows' counts now and ``total`` the sum of ``need``."""
        t = self.table
        ids = self.kv.allocate(total)
        if total == sel.size and total == int(np.count_nonzero(need)):  # one block each
            self.flat[t.seg[sel] + nblk] = ids
            t.nblk[sel] = nblk + 1
        elif total == int(np.count_nonzero(need)):  # one block for some
            mask = need > 0
            rows = sel[mask]
            self.flat[t.seg[rows] + nblk[mask]] = ids
            t.nblk[rows] = nblk[mask] + 1
        else:
            first = np.repeat(np.cumsum(need) - need, need)
            base = np.repeat(t.seg[sel] + nblk, need)
            self.flat[base + np.arange(total) - first] = ids
            t.nblk[sel] = nblk + need

    def extend(self, i: int, need: int) -> None:
        """``need`` more blocks for row ``i``."""
        t = self.table
        seg, nb = int(t.seg[i]), int(t.nblk[i])
        self.flat[seg + nb : seg + nb + need] = self.kv.allocate(need)
        t.nblk[i] = nb + need

    def free(self, i: int) -> None:
        """Give row ``i``'s blocks back to the KV cache."""
        t = self.table
        nb = int(t.nblk[i])
        if nb:
            seg = int(t.seg[i])
            self.kv.free(self.flat[seg : seg + nb])
            t.nblk[i] = 0

    def held(self) -> dict[int, np.ndarray]:
        """KV block ids each request holds now (for checks; not for the hot path)."""
        t = self.table
        return {
            int(t.rid[i]): self.flat[t.seg[i] : t.seg[i] + t.nblk[i]].copy()
            for i in np.flatnonzero(t.nblk[: t.n]).tolist()
        }
