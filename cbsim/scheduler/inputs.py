"""The input ids of a batch with prompt chunks: prompt tokens, outputs already filled in (a
recompute after preemption re-feeds them), and for decode rows the latest output or, while it is
pending, a placeholder 0 that the carry-over fills. A table that keeps no tokens gives 0 for the
prompt and recompute ids (its rows hold the latest output only)."""

from __future__ import annotations

import numpy as np

from cbsim.scheduler.batch import _EMPTY_I64
from cbsim.scheduler.table import RequestTable


def batch_inputs(
    t: RequestTable,
    idx: np.ndarray,
    q: np.ndarray,
    start: np.ndarray,
    plen: np.ndarray,
    sample: np.ndarray,
    all_sample: bool,
) -> tuple[int, np.ndarray, np.ndarray, int]:
    """(decode rows, flattened input ids, per-row placeholder mask, query tokens) of a batch."""
    n = idx.size
    if all_sample and int(q.max()) == 1 and bool((start >= plen).all()):
        # pure decode: one token each, the request's latest output (or its placeholder)
        filled = t.nfilled[idx] > start - plen
        return n, np.where(filled, t.lasttok[idx], 0), ~filled, n
    decode = (q == 1) & sample & (start >= plen)
    input_ids, placeholder = build_inputs(t, idx, q, start, plen, decode)
    return int(np.count_nonzero(decode)), input_ids, placeholder, int(q.sum())


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
        if e > p + int(t.nfilled[i]):
            raise AssertionError(
                f"request {int(t.rid[i])}: a {e - s}-token query needs outputs not filled"
            )
        if not t.keep_tokens:
            continue
        if e <= p:
            ids[o : o + e - s] = t.prompts[i][s:e]
            continue
        t.flush_log()
        seq = np.concatenate(
            (
                t.prompts[i][s:p] if s < p else _EMPTY_I64,
                t.outbuf[t.outoff[i] + max(s - p, 0) : t.outoff[i] + e - p],
            )
        )
        ids[o : o + e - s] = seq
    return ids, placeholder
