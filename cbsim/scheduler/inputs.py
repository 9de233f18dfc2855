"""The input ids of a batch with prompt chunks: prompt tokens, outputs already filled in (a
recompute after preemption re-feeds them), and for decode rows the latest output or, while it is
pending, a placeholder 0 that the carry-over fills."""

from __future__ import annotations

import numpy as np

from cbsim.scheduler.batch import _EMPTY_I64
from cbsim.scheduler.table import RequestTable


def build_inputs(
    t: RequestTable,
    idx: np.ndarray,
    q: np.ndarray,
    start: np.ndarray,
    plen: np.ndarray,
    decode: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(flattened input ids, per-row placeholder mask) for rows ``idx`` with queries ``q``
    starting at ``start``; ``decode`` marks the one-token decode rows."""
    total = int(q.sum())
    ids = np.zeros(total, dtype=np.int64)
    offs = np.cumsum(q) - q
    placeholder = np.zeros(idx.size, dtype=bool)
    if decode.any():
        d = idx[decode]
        filled = t.nfilled[d] > start[decode] - plen[decode]
        ids[offs[decode]] = np.where(filled, t.lasttok[d], 0)
        placeholder[decode] = ~filled
    for j in np.flatnonzero(~decode).tolist():
        i = int(idx[j])
        s, e, p, o = int(start[j]), int(start[j] + q[j]), int(plen[j]), int(offs[j])
        if e <= p:
            ids[o : o + e - s] = t.prompts[i][s:e]
            continue
        nf = int(t.nfilled[i])
        if e > p + nf:
            raise AssertionError(
                f"request {int(t.rid[i])}: a {e - s}-token query needs outputs not filled"
            )
        t.flush_log()
        seq = np.concatenate(
            (
                t.prompts[i][s:p] if s < p else _EMPTY_I64,
                t.outbuf[t.outoff[i] + max(s - p, 0) : t.outoff[i] + e - p],
            )
        )
        ids[o : o + e - s] = seq
    return ids, placeholder
