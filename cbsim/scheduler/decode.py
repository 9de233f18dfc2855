"""Steady decode: the same running requests as the last batch, one token each, nobody to admit.

The general path (scheduler.py) enters this state when a batch sampled every running request;
``schedule`` then builds the identical batch the general path would, without per-request Python
work, and hands back (returning None, changing nothing) whenever something else could happen: a
preemption, an admission. The running requests' counters (``computed``, ``nsched``) are written
back lazily by ``sync``, which every reader calls first. ``stretch``/``skip`` advance many
steady steps at once for a caller that needs no batch of them (the simulator's fast-forward).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from cbsim.kv_blocks import KVBlockManager
from cbsim.scheduler.admission import Admission
from cbsim.scheduler.batch import _EMPTY_I64, Batch, _frozen
from cbsim.scheduler.blocks import BlockTables
from cbsim.scheduler.table import DRAINING, RequestTable
from cbsim.scheduler.update import TokenUpdate


class Owner(Protocol):
    """What steady decode reads and moves of the scheduler that composes it."""

    run: np.ndarray  # the running queue
    step: int  # step of the next batch
    draining: int
    batch_size: int
    max_batch_tokens: int
    block_size: int
    kv: KVBlockManager
    table: RequestTable
    blocks: BlockTables
    admission: Admission
    updates: TokenUpdate


class SteadyDecode:
    """The steady-decode state and fast path of one Scheduler."""

    def __init__(self, sched: Owner) -> None:
        self.s = sched
        self.table, self.blocks = sched.table, sched.blocks
        self.active = False  # the next schedule() may take the fast path
        self.enabled = True  # Scheduler.fast_path
        self.ctx = _EMPTY_I64  # the next batch's start_pos
        self.fin = 0  # steps until someone's last output: min(maxnew - nsched)
        self.blk = 0  # steps until someone opens a block: min(nblk * block - ctx)
        self.kv = 0  # the next batch's kv_tokens before its step
        self.k = 0  # steady steps not yet written back (sync)
        self.fields: dict[str, object] = {}
        self.no = _EMPTY_I64  # an all-False placeholder mask

    def enter(
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
            "block_size": self.s.block_size,
            "sample": ones.astype(bool),
            "sample_idx": idx,
            "finishing": _EMPTY_I64,
            "_seg": seg,
        }
        for v in steady.values():
            if isinstance(v, np.ndarray):
                v.flags.writeable = False
        t = self.table
        self.active = True
        self.fields = steady
        self.no = _frozen(np.zeros(n, dtype=bool))
        self.ctx = ctx
        self.k = 0
        self.fin = int((t.maxnew[idx] - t.nsched[idx]).min())
        self.blk = int((t.nblk[idx] * self.s.block_size - ctx).min())
        self.kv = int(ctx.sum())

    def new_blocks(self) -> tuple[int, np.ndarray | None, np.ndarray | None]:
        """Blocks the next steady step opens: (count, which running rows, their block counts)."""
        if self.blk > 0:
            return 0, None, None
        nblk = self.table.nblk[self.s.run]
        m = self.ctx == nblk * self.s.block_size
        return int(np.count_nonzero(m)), m, nblk

    def admission_pending(self, now_s: float, free: int) -> bool:
        """Would the general path admit the waiting head now, with ``free`` blocks left?"""
        s = self.s
        n = s.run.size
        w = s.admission.waiting
        if not (w and n < s.batch_size and s.max_batch_tokens > n):
            return False
        i = w[0]
        if not s.admission.ready(i, now_s):
            return False
        qi = s.admission.first_chunk(i, s.max_batch_tokens - n)
        return qi is not None and s.kv.blocks_needed(qi) <= free

    def schedule(self, now_s: float) -> Batch | None:
        """The next steady batch, exactly what the general path would build (the tests compare
        both), or None, changing nothing, when the general path is needed."""
        s = self.s
        run = s.run
        n = run.size
        start = self.ctx
        fields = self.fields
        cnt, m, nblk = self.new_blocks()
        if cnt > s.kv.num_free:
            return None  # preemption: the general path
        if self.admission_pending(now_s, s.kv.num_free - cnt):
            return None
        if cnt:
            self.blocks.flat[fields["_seg"][m] + nblk[m]] = s.kv.allocate(cnt)
            nblk = nblk + m
            self.table.nblk[run] = nblk
            self.blk = int((nblk * s.block_size - start).min())
        ctx = start + 1
        ctx.flags.writeable = False  # the next batch's start_pos
        self.ctx = ctx
        self.k += 1
        self.fin -= 1
        self.blk -= 1
        self.kv += n
        step = s.step
        s.step = step + 1
        batch = Batch.__new__(Batch)
        d = batch.__dict__
        d.update(fields)
        d["step"] = step
        d["start_pos"] = start
        d["context_lens"] = ctx
        d["query_tokens"] = n
        d["kv_tokens"] = self.kv
        d["_flat"] = self.blocks.flat
        if s.updates.next_step == step:  # the previous batch is updated: real tokens
            d["input_ids"] = self.table.lasttok[run]
            d["placeholder"] = self.no
        else:  # its outputs are pending: placeholders the carry-over fills
            d["input_ids"] = np.zeros(n, dtype=np.int64)
            d["placeholder"] = fields["sample"]
        if self.fin <= 0:  # someone's last output: it leaves the running queue
            self._finishing(d, fields, ctx)
        return batch

    def _finishing(self, d: dict, fields: dict, ctx: np.ndarray) -> None:
        s, t = self.s, self.table
        run = s.run
        self.sync()
        done = t.nsched[run] == t.maxnew[run]
        finishing = run[done]
        t.state[finishing] = DRAINING
        s.draining += int(finishing.size)
        d["finishing"] = finishing
        keep = ~done
        s.run = run[keep]
        self.active = False
        self.enter(run, fields, ctx, keep)

    def sync(self) -> None:
        """Write back the counters the steady path left pending."""
        k = self.k
        if k:
            run = self.s.run
            self.table.nsched[run] += k
            self.table.computed[run] = self.ctx
            self.k = 0

    # ------------------------------------------------------------------ many steps at once

    def stretch(self, limit: int, now_s: float) -> tuple[int, float]:
        """How many of the next ``schedule`` calls (at most ``limit``) are certain to be steady
        decode of the same rows, none of them finishing, preempting or admitting, and the
        arrival after which one might admit: (steps, arrival_s; inf: none can)."""
        s, t = self.s, self.table
        run = s.run
        if not (self.active and self.enabled and run.size):
            return 0, float("inf")
        k = min(limit, self.fin - 1)  # the batch that samples someone's last output changes
        admit_at = float("inf")
        w = s.admission.waiting
        if w and run.size < s.batch_size and s.max_batch_tokens > run.size:
            i = w[0]
            if t.arrival[i] > now_s and t.nfilled[i] == t.nsched[i]:
                admit_at = float(t.arrival[i])
            elif not s.admission.ready(i, now_s):
                return 0, admit_at  # a pending output: an update may let it in
            elif self.admission_pending(now_s, s.kv.num_free):
                return 0, admit_at
        if k <= 0:
            return 0, admit_at
        # blocks: steps until the running rows' new blocks outgrow the free ones
        room = t.nblk[run] * s.block_size - self.ctx  # steps until each row's next block
        free = s.kv.num_free
        if self._opened_through(room, k - 1) > free:
            lo, hi = 0, k - 1  # the first step whose schedule would preempt lies in [lo, hi]
            while lo < hi:
                mid = (lo + hi) // 2
                if self._opened_through(room, mid) > free:
                    hi = mid
                else:
                    lo = mid + 1
            k = lo
        return k, admit_at

    def _opened_through(self, room: np.ndarray, j: int) -> int:
        """Blocks the steady steps 0..j open in all (``room``: steps until each row's next)."""
        return int(np.maximum(0, (j - room) // self.s.block_size + 1).sum())

    def _opened(self, k: int) -> np.ndarray:
        """Blocks each of the next ``k`` steady steps opens (int64, one entry per step)."""
        bs = self.s.block_size
        room = self.table.nblk[self.s.run] * bs - self.ctx  # steps until each row's next block
        per_row = np.maximum(0, (k - 1 - room) // bs + 1)
        out = np.zeros(k, dtype=np.int64)
        if per_row.any():
            steps = np.concatenate(
                [r + bs * np.arange(c) for r, c in zip(room.tolist(), per_row.tolist()) if c]
            )
            np.add.at(out, steps, 1)
        return out

    def skip(self, k: int) -> None:
        """``k`` steady schedules (``stretch`` said they are plain) without building their
        batches: the blocks granted in the order ``schedule`` grants them, the counters left
        pending as ``schedule`` leaves them."""
        s, t = self.s, self.table
        run = s.run
        bs = s.block_size
        nblk = t.nblk[run]
        room = nblk * bs - self.ctx
        per_row = np.maximum(0, (k - 1 - room) // bs + 1)
        total = int(per_row.sum())
        if total:
            rows = np.flatnonzero(per_row)
            cnt = per_row[rows]
            row = np.repeat(rows, cnt)  # position in the running queue
            nth = np.arange(total) - np.repeat(np.cumsum(cnt) - cnt, cnt)
            step = room[row] + bs * nth
            order = np.lexsort((row, step))  # step by step, in running order within a step
            row, nth = row[order], nth[order]
            seg = self.fields["_seg"]
            self.blocks.flat[seg[row] + nblk[row] + nth] = s.kv.allocate(total)
            nblk = nblk + per_row
            t.nblk[run] = nblk
        ctx = self.ctx + k
        ctx.flags.writeable = False
        self.ctx = ctx
        self.k += k
        self.fin -= k
        self.blk = int((nblk * bs - ctx).min())
        self.kv += run.size * k
        s.step += k
