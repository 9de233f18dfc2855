"""A step's attention groups, the same in both back ends: runtime/io_slots.py packs them, the cost
model prices them.

- decode rows, through the paged decode kernel: each request with one query token, and each
  token of a short continuation (a prompt chunk after its cached prefix of at most
  ``engine.continuation_decode_max`` tokens), a row per token over the request's own table,
  attending to the keys up to its own position;
- prompt chunks from position 0 ("fresh"): causal attention over the chunk's own keys;
- longer continuations ("ext"): masked attention over the gathered table.

A continuation is a few query rows against a long table: the masked path runs one program per
kv head and query block walking the whole gathered table (2-7 rows against an 8208-token table
added 15-30 ms to a 255 ms step of the 8B, the H200's long_prompt recording; hardware.gpu.
prefix_walk_us_per_element). As decode rows the table is read with the decode kernel's split-K
parallelism, as the kernel tables time it. Which route is faster at which length is what
benchmarks/bench_continuation.py measures; it has not run on the GPU, and
``engine.continuation_decode_max`` is 0 by default.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AttentionGroups:
    """Indices into a batch's requests (``*_req``) and, per decode row, its token offset within
    the request's chunk and the keys it attends to."""

    dec_req: np.ndarray
    dec_off: np.ndarray
    dec_ctx: np.ndarray
    fresh: np.ndarray
    ext: np.ndarray

    @property
    def decode_rows(self) -> int:
        return len(self.dec_req)


def attention_groups(
    query_lens: np.ndarray, start_pos: np.ndarray, context_lens: np.ndarray, short_max: int
) -> AttentionGroups:
    """The groups of a batch with per-request query lengths, cached prefixes and contexts
    (context = prefix + this step's tokens); ``short_max`` 0: every continuation is "ext"."""
    q = np.asarray(query_lens, dtype=np.int64)
    start = np.asarray(start_pos, dtype=np.int64)
    ctx = np.asarray(context_lens, dtype=np.int64)
    chunk = q > 1
    cont = chunk & (start > 0)
    short = cont & (q <= short_max)
    one = np.flatnonzero(~chunk)
    sh = np.flatnonzero(short)
    reps = q[sh]
    sh_req = np.repeat(sh, reps)
    sh_off = np.arange(int(reps.sum()), dtype=np.int64) - np.repeat(np.cumsum(reps) - reps, reps)
    return AttentionGroups(
        dec_req=np.concatenate([one, sh_req]),
        dec_off=np.concatenate([np.zeros(len(one), np.int64), sh_off]),
        dec_ctx=np.concatenate([ctx[one], start[sh_req] + sh_off + 1]),
        fresh=np.flatnonzero(chunk & (start == 0)),
        ext=np.flatnonzero(cont & ~short),
    )


def groups_of(batch, short_max: int) -> AttentionGroups:
    """``attention_groups`` of a scheduler Batch (or anything with its length arrays)."""
    return attention_groups(batch.query_lens, batch.start_pos, batch.context_lens, short_max)


def extra_table_entries(groups: AttentionGroups, context_lens: np.ndarray, block_size: int) -> int:
    """Block-table entries the runtime copies in for the decode rows beyond a request's first
    (each short continuation row carries its request's table)."""
    req = groups.dec_req[groups.dec_off > 0]
    return int((-(-np.asarray(context_lens)[req] // block_size)).sum())


def max_decode_rows(max_requests: int, max_tokens: int, short_max: int) -> int:
    """The most decode rows a step can have: a row per request, plus each short continuation's
    tokens beyond it (every request's chunk that short, and no more than a step has tokens)."""
    return max_requests + min(max_tokens, short_max * max_requests)
