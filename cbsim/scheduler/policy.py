"""The scheduling policy: ``Scheduler``, its state, and ``schedule`` (the general path).

Running requests first, in admission order, each with its next query (one decode token, or its
next prefill chunk), then waiting requests FIFO while ``workload.batch_size`` and
``workload.max_batch_tokens`` allow; KV blocks allocated at schedule time, admission waiting for
blocks, preemption by recompute from the back of the running queue. The contract and the whole
policy: the package docstring (cbsim/scheduler/__init__.py) and docs/architecture.md. The
per-request table, the steady-decode fast path and ``update`` are mixins (state.py, steady.py,
update.py) whose state this ``__init__`` declares.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from cbsim.config.schema import WorkloadConfig
from cbsim.kv_blocks import KVBlockManager
from cbsim.scheduler.batch import _EMPTY_I64, Batch
from cbsim.scheduler.state import DRAINING, RUNNING, WAITING, RequestTable
from cbsim.scheduler.steady import SteadyDecode
from cbsim.scheduler.update import TokenUpdate


class Scheduler(TokenUpdate, SteadyDecode, RequestTable):
    """Continuous-batching scheduler over a paged KV cache of ``num_kv_blocks`` blocks of
    ``workload.kv_block_size`` tokens (``None``: ``workload.kv_num_blocks``, which must then be
    set; see ``default_num_kv_blocks``). ``eos_token_id`` ends a request early unless
    ``workload.ignore_eos``. Requests are identified by their ``rid`` (any int, unique)."""

    def __init__(
        self,
        workload: WorkloadConfig,
        num_kv_blocks: int | None = None,
        eos_token_id: int | None = None,
    ) -> None:
        if num_kv_blocks is None:
            num_kv_blocks = workload.kv_num_blocks
        if num_kv_blocks is None:
            raise ValueError(
                "Scheduler needs num_kv_blocks (workload.kv_num_blocks is None); use "
                "default_num_kv_blocks(workload, requests)"
            )
        self.workload = workload
        self.batch_size = int(workload.batch_size)
        self.max_batch_tokens = int(workload.max_batch_tokens)
        self.chunked_prefill = bool(workload.chunked_prefill)
        self.block_size = int(workload.kv_block_size)
        self.eos_token_id = None if workload.ignore_eos else eos_token_id
        self.kv = KVBlockManager(num_kv_blocks, self.block_size)
        # per-request state, indexed by the internal index (order of add)
        self._n = 0
        self._cap = 0
        self._grow(64)
        self._prompts: list[np.ndarray] = []
        self._index: dict[int, int] = {}
        # outputs: logged per update, moved into one flat buffer (a max_new_tokens segment per
        # request, given at its first flush) when someone reads them
        self._outbuf = np.zeros(0, dtype=np.int64)
        self._outbuf_top = 0
        # block tables: one segment of the flat table per admission, never reused, so a batch's
        # views stay valid after later schedule() calls
        self._flat = np.zeros(1024, dtype=np.int32)
        self._flat_top = 0
        self._run = _EMPTY_I64  # running (schedulable) requests, admission order
        self._waiting: deque[int] = deque()
        self._draining = 0  # last output scheduled, awaiting the update that retires them
        self._unfinished = 0
        self._step = 0  # step of the next batch
        self._next_update = 0  # step of the next batch to update
        self._eos_finished = False  # some request retired by EOS: batches may hold stale entries
        self._log: list[tuple[np.ndarray, np.ndarray]] = []  # (idx, tokens) per update
        self.last_first_token_rids: list[int] = []  # rids whose output 0 the last update filled
        self.last_num_kept = 0  # tokens the last update kept (outputs after an EOS: dropped)
        self.num_preemptions = 0
        # steady decode state (see _schedule_steady); fast_path=False runs the general path only
        self.fast_path = True
        self._steady = False
        self._steady_ctx = _EMPTY_I64
        self._steady_fin = 0
        self._steady_blk = 0
        self._steady_kv = 0
        self._steady_k = 0
        self._steady_fields: dict[str, object] = {}
        self._steady_no = _EMPTY_I64

    # ------------------------------------------------------------------ schedule

    def schedule(self, now_s: float = math.inf) -> Batch | None:
        """The next batch, or None when nothing can run now (see ``next_arrival_s``)."""
        if self._steady and self.fast_path:
            batch = self._schedule_steady(now_s)
            if batch is not None:
                return batch
        self._sync_steady()
        self._steady = False
        run = self._run
        budget = self.max_batch_tokens
        preempted = False
        if run.size:
            nc = self._computed[run]
            rem = self._plen[run] + self._nsched[run] - nc
            if run.size <= budget and int(rem.max()) == 1:
                q = rem
            else:
                before = np.cumsum(rem) - rem
                q = np.clip(budget - before, 0, rem)
            nblk = self._nblk[run]
            need = (nc + q + (self.block_size - 1)) // self.block_size - nblk
            total = int(need.sum())
            if total <= self.kv.num_free:
                if total:
                    self._grant(run, need, total, nblk)
                run_sel = run
                if q is not rem and not q.all():
                    keep = q > 0
                    run_sel, q = run[keep], q[keep]
            else:
                before_preemptions = self.num_preemptions
                run_sel, q = self._schedule_running_slow(budget)
                preempted = self.num_preemptions != before_preemptions
                run = self._run
            budget -= int(q.sum())
        else:
            run_sel, q = _EMPTY_I64, _EMPTY_I64

        # admission: FIFO, within batch_size, the token budget and free blocks
        adm: list[int] = []
        adm_q: list[int] = []
        waiting = self._waiting
        # a step that preempted admits nobody (no thrashing), unless nothing else runs
        if (
            waiting
            and (not preempted or not run_sel.size)
            and budget > 0
            and run.size < self.batch_size
        ):
            n_run = int(run.size)
            while waiting and n_run < self.batch_size and budget > 0:
                i = waiting[0]
                if self._arrival[i] > now_s or self._nfilled[i] != self._nsched[i]:
                    break
                total = int(self._plen[i] + self._nsched[i])
                if total <= budget:
                    qi = total
                elif self.chunked_prefill or total > self.max_batch_tokens:
                    qi = budget
                else:
                    break
                need_i = self.kv.blocks_needed(qi)
                if need_i > self.kv.num_free:
                    break
                waiting.popleft()
                self._admit(i, need_i)
                adm.append(i)
                adm_q.append(qi)
                budget -= qi
                n_run += 1
        if adm:
            adm_arr = np.asarray(adm, dtype=np.int64)
            idx = np.concatenate((run_sel, adm_arr))
            q = np.concatenate((q, np.asarray(adm_q, dtype=np.int64)))
            run = np.concatenate((run, adm_arr))
        else:
            idx = run_sel
        if idx.size == 0:
            self._run = run
            self._check_stuck(now_s)
            return None
        return self._commit(idx, q, run)

    def _grant(self, sel: np.ndarray, need: np.ndarray, total: int, nblk: np.ndarray) -> None:
        """Allocate ``need[j]`` more blocks to request ``sel[j]`` (same order)."""
        ids = self.kv.allocate(total)
        if total == sel.size and total == int(np.count_nonzero(need)):  # one block each
            self._flat[self._seg[sel] + nblk] = ids
            self._nblk[sel] = nblk + 1
        elif total == int(np.count_nonzero(need)):  # one block for some
            mask = need > 0
            rows = sel[mask]
            self._flat[self._seg[rows] + nblk[mask]] = ids
            self._nblk[rows] = nblk[mask] + 1
        else:
            first = np.repeat(np.cumsum(need) - need, need)
            base = np.repeat(self._seg[sel] + nblk, need)
            self._flat[base + np.arange(total) - first] = ids
            self._nblk[sel] = nblk + need

    def _admit(self, i: int, need: int) -> None:
        cap = self.kv.blocks_needed(int(self._plen[i] + self._maxnew[i]) - 1)
        top = self._flat_top
        if top + cap > self._flat.size:
            new = np.zeros(max(2 * self._flat.size, top + cap), dtype=np.int32)
            new[:top] = self._flat[:top]
            self._flat = new  # batches keep the old array, which still holds their blocks
        self._seg[i] = top
        self._flat_top = top + cap
        self._flat[top : top + need] = self.kv.allocate(need)
        self._nblk[i] = need
        self._state[i] = RUNNING

    def _schedule_running_slow(self, budget: int) -> tuple[np.ndarray, np.ndarray]:
        """Running requests one at a time, preempting from the back when blocks run out."""
        run = self._run.tolist()
        sel: list[int] = []
        qs: list[int] = []
        bs = self.block_size
        j = 0
        while j < len(run) and budget > 0:
            i = run[j]
            nc = int(self._computed[i])
            qi = min(int(self._plen[i] + self._nsched[i]) - nc, budget)
            need = (nc + qi + bs - 1) // bs - int(self._nblk[i])
            while need > self.kv.num_free:
                victim = run.pop()
                self._preempt(victim)
                if victim == i:
                    break
            if j >= len(run) or run[j] != i:
                break  # preempted itself
            if need:
                seg, nb = int(self._seg[i]), int(self._nblk[i])
                self._flat[seg + nb : seg + nb + need] = self.kv.allocate(need)
                self._nblk[i] = nb + need
            sel.append(i)
            qs.append(qi)
            budget -= qi
            j += 1
        self._run = np.asarray(run, dtype=np.int64)
        return np.asarray(sel, dtype=np.int64), np.asarray(qs, dtype=np.int64)

    def _preempt(self, i: int) -> None:
        """Recompute preemption: free the blocks, back to the front of the waiting queue."""
        self._free_blocks(i)
        self._computed[i] = 0
        self._state[i] = WAITING
        self._npreempt[i] += 1
        self.num_preemptions += 1
        self._waiting.appendleft(i)

    def _commit(self, idx: np.ndarray, q: np.ndarray, run: np.ndarray) -> Batch:
        """Commit progress optimistically and build the batch."""
        start = self._computed[idx]
        plen = self._plen[idx]
        ctx = start + q
        n = idx.size
        sample = ctx == plen + self._nsched[idx]
        all_sample = bool(sample.all())
        if all_sample and int(q.max()) == 1 and bool((start >= plen).all()):
            # pure decode: one token each, the request's latest output (or its placeholder)
            num_decode = n
            filled = self._nfilled[idx] > start - plen
            input_ids = np.where(filled, self._lasttok[idx], 0)
            placeholder = ~filled
            query_tokens = n
        else:
            decode = (q == 1) & sample & (start >= plen)
            num_decode = int(np.count_nonzero(decode))
            input_ids, placeholder = self._build_inputs(idx, q, start, plen, decode)
            query_tokens = int(q.sum())
        # commit: KV grows by the query, each sampled position adds one pending output
        self._computed[idx] = ctx
        sidx = idx if all_sample else idx[sample]
        ns = self._nsched[sidx] + 1
        self._nsched[sidx] = ns
        done = ns == self._maxnew[sidx]
        if done.any():
            finishing = sidx[done]
            self._state[finishing] = DRAINING
            self._draining += int(finishing.size)
            run = run[self._state[run] == RUNNING]
        else:
            finishing = _EMPTY_I64
        self._run = run
        step = self._step
        self._step = step + 1
        num_prefill = n - num_decode
        fields = {
            "idx": idx,
            "rids": self._rid[idx],
            "query_lens": q,
            "prompt_lens": plen,
            "num_requests": n,
            "kind": "decode" if num_prefill == 0 else ("prefill" if num_decode == 0 else "mixed"),
            "num_prefill": num_prefill,
            "num_decode": num_decode,
            "num_samples": int(sidx.size),
            "block_size": self.block_size,
            "sample": sample,
            "sample_idx": sidx,
            "finishing": finishing,
            "_seg": self._seg[idx],
        }
        batch = Batch(
            step=step,
            start_pos=start,
            context_lens=ctx,
            placeholder=placeholder,
            input_ids=input_ids,
            query_tokens=query_tokens,
            kv_tokens=int(ctx.sum()),
            _flat=self._flat,
            **fields,
        )
        # every running request sampled: the next steps are pure decode of the survivors,
        # which _schedule_steady runs without recomputing what stays put
        self._steady = False
        if all_sample and idx.size == run.size + finishing.size:
            keep = None if not finishing.size else self._state[idx] == RUNNING
            self._enter_steady(idx, fields, ctx, keep)
        return batch

    def _build_inputs(
        self,
        idx: np.ndarray,
        q: np.ndarray,
        start: np.ndarray,
        plen: np.ndarray,
        decode: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        total = int(q.sum())
        ids = np.zeros(total, dtype=np.int64)
        offs = np.cumsum(q) - q
        placeholder = np.zeros(idx.size, dtype=bool)
        if decode.any():
            d = idx[decode]
            filled = self._nfilled[d] > start[decode] - plen[decode]
            ids[offs[decode]] = np.where(filled, self._lasttok[d], 0)
            placeholder[decode] = ~filled
        for j in np.flatnonzero(~decode).tolist():
            i = int(idx[j])
            s, e, p, o = int(start[j]), int(start[j] + q[j]), int(plen[j]), int(offs[j])
            if e <= p:
                ids[o : o + e - s] = self._prompts[i][s:e]
                continue
            nf = int(self._nfilled[i])
            if e > p + nf:
                raise AssertionError(
                    f"request {int(self._rid[i])}: a {e - s}-token query needs outputs not filled"
                )
            self._flush_log()
            seq = np.concatenate(
                (
                    self._prompts[i][s:p] if s < p else _EMPTY_I64,
                    self._outbuf[self._outoff[i] + max(s - p, 0) : self._outoff[i] + e - p],
                )
            )
            ids[o : o + e - s] = seq
        return ids, placeholder

    def _check_stuck(self, now_s: float) -> None:
        """Nothing scheduled, nothing running or in flight, and the head has arrived: the head
        can never run (a bug, or a request larger than the cache)."""
        if self._run.size or self._draining or self._next_update != self._step:
            return
        if not self._waiting:
            return
        i = self._waiting[0]
        if self._arrival[i] > now_s:
            return
        raise RuntimeError(
            f"scheduler stuck: request {int(self._rid[i])} (prompt {int(self._plen[i])}, "
            f"{int(self._nsched[i])} outputs) cannot be admitted with {self.kv.num_free} free "
            f"KV blocks and a budget of {self.max_batch_tokens} tokens"
        )
