"""One forward pass as the scheduler hands it out (``Batch``), and ``carry_over_index``: which
input of the next batch each sampled output of a batch feeds (the async loop's carry-over)."""

from __future__ import annotations

from functools import cached_property

import numpy as np

_EMPTY_I64 = np.empty(0, dtype=np.int64)
_EMPTY_I64.flags.writeable = False


def _frozen(a: np.ndarray) -> np.ndarray:
    """Arrays shared by several batches are read-only."""
    a.flags.writeable = False
    return a


class Batch:
    """One forward pass: per-request arrays in batch order, flattened per-token arrays.

    Per request (numpy, batch order): ``rids``, ``query_lens``, ``start_pos`` (KV tokens already
    cached = position of the first query token), ``context_lens`` (start_pos + query_lens),
    ``prompt_lens``, ``sample`` (bool: the last query position yields a kept token),
    ``placeholder`` (bool: the input is a pending token, a placeholder 0; always a one-token
    decode), ``num_blocks`` (blocks covering context_lens). Flattened over query tokens
    (int64): ``input_ids``, ``positions``, ``slot_mapping`` (block_id * block_size + offset:
    where the token's K/V goes). Per sampled output, in the order of ``sample`` == True entries:
    ``logits_indices`` (flattened query index to sample from), ``sample_rids``. Totals:
    ``step``, ``num_requests``, ``query_tokens``, ``kv_tokens`` (sum of context_lens),
    ``num_prefill``, ``num_decode``, ``num_samples``, ``kind`` ("prefill" | "decode" | "mixed";
    a decode entry is one query token past the prompt that samples).

    ``block_tables`` is a list of per-request int32 block-id arrays (exactly the blocks covering
    each context); ``block_table_array(width, pad)`` gives them as one padded int32 2-D array.
    Derived fields (positions, slot_mapping, block tables, cu_* and logits_indices) are computed
    on first access and stay valid: a batch never changes after ``schedule`` returns it. Its
    arrays may be shared with other batches: treat them as read-only.
    """

    step: int
    idx: np.ndarray  # the scheduler's internal request indices (for update)
    rids: np.ndarray
    query_lens: np.ndarray
    start_pos: np.ndarray
    context_lens: np.ndarray
    prompt_lens: np.ndarray
    sample: np.ndarray
    placeholder: np.ndarray
    input_ids: np.ndarray
    num_requests: int
    query_tokens: int
    kv_tokens: int
    num_prefill: int
    num_decode: int
    num_samples: int
    kind: str
    block_size: int
    sample_idx: np.ndarray  # internal indices of the sampled entries
    finishing: np.ndarray  # internal indices whose last output this batch samples
    _flat: np.ndarray  # the scheduler's flat block table when this batch was built
    _seg: np.ndarray  # each entry's segment in it

    def __init__(self, **fields: object) -> None:
        self.__dict__.update(fields)

    def __len__(self) -> int:
        return self.num_requests

    def __repr__(self) -> str:
        return (
            f"Batch(step={self.step}, kind={self.kind!r}, requests={self.num_requests}, "
            f"query_tokens={self.query_tokens}, kv_tokens={self.kv_tokens}, "
            f"samples={self.num_samples})"
        )

    @cached_property
    def cu_query_lens(self) -> np.ndarray:
        """Prefix sums of query_lens, length requests + 1 (int64; varlen attention's cu_seqlens_q)."""
        cu = np.zeros(self.num_requests + 1, dtype=np.int64)
        np.cumsum(self.query_lens, out=cu[1:])
        return cu

    @cached_property
    def cu_context_lens(self) -> np.ndarray:
        """Prefix sums of context_lens, length requests + 1 (varlen attention's cu_seqlens_k)."""
        cu = np.zeros(self.num_requests + 1, dtype=np.int64)
        np.cumsum(self.context_lens, out=cu[1:])
        return cu

    @property
    def max_query_len(self) -> int:
        return int(self.query_lens.max()) if self.num_requests else 0

    @property
    def max_context_len(self) -> int:
        return int(self.context_lens.max()) if self.num_requests else 0

    @cached_property
    def positions(self) -> np.ndarray:
        """Position of every query token (flattened, int64)."""
        if self.num_decode == self.num_requests:
            return self.start_pos.copy()
        cu = self.cu_query_lens
        return np.repeat(self.start_pos - cu[:-1], self.query_lens) + np.arange(
            self.query_tokens, dtype=np.int64
        )

    @cached_property
    def logits_indices(self) -> np.ndarray:
        """Flattened query index of every sampled position, in sample order (int64)."""
        return (self.cu_query_lens[1:] - 1)[self.sample]

    @property
    def sample_rids(self) -> np.ndarray:
        return self.rids[self.sample]

    @cached_property
    def placeholder_positions(self) -> np.ndarray:
        """Flattened input positions holding a placeholder 0 (int64)."""
        return self.cu_query_lens[:-1][self.placeholder]

    @cached_property
    def num_blocks(self) -> np.ndarray:
        return (self.context_lens + (self.block_size - 1)) // self.block_size

    @cached_property
    def slot_mapping(self) -> np.ndarray:
        """KV slot (block_id * block_size + offset) of every query token (flattened, int64)."""
        pos = self.positions
        bs = self.block_size
        seg = self._seg
        if self.num_decode != self.num_requests:
            seg = np.repeat(seg, self.query_lens)
        blocks = self._flat[seg + pos // bs].astype(np.int64)
        return blocks * bs + pos % bs

    @cached_property
    def block_tables(self) -> list[np.ndarray]:
        """Per request, the int32 ids of the blocks covering its context (read-only views)."""
        flat = self._flat
        return [flat[s : s + n] for s, n in zip(self._seg.tolist(), self.num_blocks.tolist())]

    def block_table_array(self, width: int | None = None, pad: int = -1) -> np.ndarray:
        """Block tables as one int32 array [requests, width] (width defaults to the longest),
        padded with ``pad``."""
        nb = self.num_blocks
        longest = int(nb.max()) if self.num_requests else 0
        w = longest if width is None else int(width)
        if longest > w:
            raise ValueError(f"width={w} is below the longest block table ({longest})")
        cols = np.arange(w, dtype=np.int64)
        mask = cols[None, :] < nb[:, None]
        src = np.where(mask, self._seg[:, None] + cols[None, :], 0)
        out = self._flat[src]
        return np.where(mask, out, np.int32(pad)).astype(np.int32)


def carry_over_index(prev: Batch, nxt: Batch) -> np.ndarray:
    """For each sampled output of ``prev`` (in prev's order of ``sample`` == True entries), the
    flattened input position of ``nxt`` that holds its placeholder, -1 for none (int64).

    The runtime scatters ``outputs_prev`` into ``nxt.input_ids`` with it. An output matches a
    placeholder when both belong to the same request and the output's position (prev's context
    length) is the placeholder's position (nxt's start_pos), so any pair of batches gives the
    right answer (-1 everywhere for unrelated batches)."""
    n = prev.num_samples
    if n == prev.num_requests and nxt.num_decode == nxt.num_requests == n:
        # steady decode: the same requests in the same order, every input a placeholder
        if (
            (prev.idx is nxt.idx or np.array_equal(prev.idx, nxt.idx))
            and (
                prev.context_lens is nxt.start_pos
                or np.array_equal(prev.context_lens, nxt.start_pos)
            )
            and (nxt.placeholder is nxt.sample or nxt.placeholder.all())
        ):
            return np.arange(n, dtype=np.int64)
    out = np.full(n, -1, dtype=np.int64)
    ph = nxt.placeholder
    if n == 0 or not ph.any():
        return out
    ph_key = (nxt.idx[ph] << 32) | nxt.start_pos[ph]
    src_key = (prev.idx[prev.sample] << 32) | prev.context_lens[prev.sample]
    ph_pos = nxt.cu_query_lens[:-1][ph]
    order = np.argsort(ph_key, kind="stable")
    sorted_key = ph_key[order]
    k = np.minimum(np.searchsorted(sorted_key, src_key), sorted_key.size - 1)
    hit = sorted_key[k] == src_key
    out[hit] = ph_pos[order][k[hit]]
    return out
