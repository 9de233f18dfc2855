"""Paged KV block manager: the one owner of KV-cache blocks (no clock, no device).

Block ids are the integers ``0 .. num_blocks - 1``; the runtime indexes its KV tensors with them
(slot = block_id * block_size + offset), so an id is handed out to one holder at a time and comes
back only through ``free``. Allocation order is deterministic (lowest free ids first at the start,
then last freed, first reused), so runs are reproducible. No prefix caching.
"""

from __future__ import annotations

import numpy as np


class KVBlockManager:
    """A free stack of block ids with a used-bitmap that refuses double frees."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks} must be >= 1")
        if block_size < 1:
            raise ValueError(f"block_size={block_size} must be >= 1")
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        # the top of the stack is the end; ids 0, 1, 2 ... come out first
        self._stack = np.arange(self.num_blocks - 1, -1, -1, dtype=np.int32)
        self._top = self.num_blocks
        self._used = np.zeros(self.num_blocks, dtype=bool)
        # scratch for free()'s duplicate check: one pass over the freed ids, no sort
        self._mark = np.zeros(self.num_blocks, dtype=np.int32)

    @property
    def num_free(self) -> int:
        return self._top

    @property
    def num_used(self) -> int:
        return self.num_blocks - self._top

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def blocks_needed(self, tokens: int) -> int:
        """Blocks that hold ``tokens`` KV entries (ceil division; 0 for 0 tokens)."""
        return -(-int(tokens) // self.block_size)

    def can_allocate(self, n: int) -> bool:
        return n <= self._top

    def allocate(self, n: int) -> np.ndarray:
        """``n`` distinct free block ids (int32); raises when fewer than ``n`` are free."""
        if n > self._top:
            raise RuntimeError(f"KV cache exhausted: {n} blocks asked, {self._top} free")
        if n <= 0:
            return np.empty(0, dtype=np.int32)
        top = self._top
        ids = self._stack[top - n : top][::-1].copy()
        self._top = top - n
        self._used[ids] = True
        return ids

    def free(self, blocks: np.ndarray) -> None:
        """Return blocks to the pool; a block that is not allocated is an error."""
        blocks = np.asarray(blocks, dtype=np.int32)
        n = blocks.size
        if n == 0:
            return
        used = self._used[blocks]  # IndexError for ids outside 0..num_blocks-1
        if not used.all() or (n > 1 and self._repeats(blocks)):
            bad = blocks[~used] if not used.all() else blocks
            raise RuntimeError(f"KV blocks freed twice or never allocated: {bad[:8].tolist()}")
        self._used[blocks] = False
        # reversed so that freeing then allocating the same count returns the same order
        self._stack[self._top : self._top + n] = blocks[::-1]
        self._top += n

    def _repeats(self, blocks: np.ndarray) -> bool:
        """Whether an id occurs twice in ``blocks``: each id marks its position, and a repeated
        id keeps only its last one (np.unique's sort cost 10-50 us per retired request)."""
        order = np.arange(blocks.size, dtype=np.int32)
        self._mark[blocks] = order
        return bool((self._mark[blocks] != order).any())

    def used_blocks(self) -> np.ndarray:
        """Ids currently allocated (for checks and tests)."""
        return np.flatnonzero(self._used).astype(np.int32)
