"""Steady decode: the same running requests as the last batch, one token each, nobody to admit.

``SteadyDecode`` is a mixin of ``Scheduler`` (cbsim/scheduler/policy.py), whose ``__init__``
declares its state (the ``_steady*`` fields). ``_commit`` enters the steady state;
``_schedule_steady`` then builds the identical batch the general path would, without per-request
Python work, and hands back to the general path (returning None, changing nothing) whenever
something else could happen: a preemption, an admission. The per-request counters of the running
requests are written back lazily by ``_sync_steady``, which every reader calls first.
"""

from __future__ import annotations

import numpy as np

from cbsim.scheduler.batch import _EMPTY_I64, Batch, _frozen
from cbsim.scheduler.state import DRAINING


class SteadyDecode:
    """The steady-decode fast path (a ``Scheduler`` mixin)."""

    def _enter_steady(
        self, idx: np.ndarray, fields: dict, ctx: np.ndarray, keep: np.ndarray | None
    ) -> None:
        """Remember the arrays that stay put while the requests ``idx[keep]`` decode."""
        rids, plen, seg = fields["rids"], fields["prompt_lens"], fields["_seg"]
        if keep is not None:
            idx, rids, plen, seg, ctx = idx[keep], rids[keep], plen[keep], seg[keep], ctx[keep]
        n = idx.size
        if n == 0:
            return
        ones = np.ones(n, dtype=np.int64)
        steady = {
            "idx": idx,
            "rids": rids,
            "query_lens": ones,
            "prompt_lens": plen,
            "num_requests": n,
            "kind": "decode",
            "num_prefill": 0,
            "num_decode": n,
            "num_samples": n,
            "block_size": self.block_size,
            "sample": ones.astype(bool),
            "sample_idx": idx,
            "finishing": _EMPTY_I64,
            "_seg": seg,
        }
        for v in steady.values():
            if isinstance(v, np.ndarray):
                v.flags.writeable = False
        self._steady = True
        self._steady_fields = steady
        self._steady_no = _frozen(np.zeros(n, dtype=bool))
        self._steady_ctx = ctx
        self._steady_k = 0
        self._steady_fin = int((self._maxnew[idx] - self._nsched[idx]).min())
        self._steady_blk = int((self._nblk[idx] * self.block_size - ctx).min())
        self._steady_kv = int(ctx.sum())

    def _schedule_steady(self, now_s: float) -> Batch | None:
        """Steady decode: the same running requests as the last batch, one token each, nobody
        to admit, nobody finishing. Produces exactly what the general path would (the tests
        compare both); returns None, changing nothing, when the general path is needed. The
        per-request counters (_computed, _nsched) of the running requests are written back
        lazily by _sync_steady before anything else reads them."""
        run = self._run
        n = run.size
        start = self._steady_ctx
        fields = self._steady_fields
        cnt = 0
        if self._steady_blk <= 0:  # some request's next token opens a new block
            bs = self.block_size
            nblk = self._nblk[run]
            m = start == nblk * bs
            cnt = int(np.count_nonzero(m))
            if cnt > self.kv.num_free:
                return None  # preemption: the general path
        w = self._waiting
        if w and n < self.batch_size and self.max_batch_tokens > n:
            i = w[0]
            if self._arrival[i] <= now_s and self._nfilled[i] == self._nsched[i]:
                # the general path would admit the head if its first chunk's blocks fit
                budget = self.max_batch_tokens - n
                total = int(self._plen[i] + self._nsched[i])
                if total <= budget or self.chunked_prefill or total > self.max_batch_tokens:
                    qi = min(total, budget)
                    if self.kv.blocks_needed(qi) <= self.kv.num_free - cnt:
                        return None
        if cnt:
            self._flat[fields["_seg"][m] + nblk[m]] = self.kv.allocate(cnt)
            nblk = nblk + m
            self._nblk[run] = nblk
            self._steady_blk = int((nblk * bs - start).min())
        ctx = start + 1
        ctx.flags.writeable = False  # the next batch's start_pos
        self._steady_ctx = ctx
        self._steady_k += 1
        self._steady_fin -= 1
        self._steady_blk -= 1
        self._steady_kv += n
        step = self._step
        self._step = step + 1
        batch = Batch.__new__(Batch)
        d = batch.__dict__
        d.update(fields)
        d["step"] = step
        d["start_pos"] = start
        d["context_lens"] = ctx
        d["query_tokens"] = n
        d["kv_tokens"] = self._steady_kv
        d["_flat"] = self._flat
        if self._next_update == step:  # the previous batch is updated: real tokens
            d["input_ids"] = self._lasttok[run]
            d["placeholder"] = self._steady_no
        else:  # its outputs are pending: placeholders the carry-over fills
            d["input_ids"] = np.zeros(n, dtype=np.int64)
            d["placeholder"] = fields["sample"]
        if self._steady_fin <= 0:  # someone's last output: it leaves the running queue
            self._sync_steady()
            done = self._nsched[run] == self._maxnew[run]
            finishing = run[done]
            self._state[finishing] = DRAINING
            self._draining += int(finishing.size)
            d["finishing"] = finishing
            keep = ~done
            self._run = run[keep]
            self._steady = False
            self._enter_steady(run, fields, ctx, keep)
        return batch

    def _sync_steady(self) -> None:
        """Write back the counters the steady path left pending."""
        k = self._steady_k
        if k:
            run = self._run
            self._nsched[run] += k
            self._computed[run] = self._steady_ctx
            self._steady_k = 0
