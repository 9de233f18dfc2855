"""``Scheduler``: the continuous-batching policy, composed of parts that each own their state.

the request table (table.py: rows, prompts, outputs), the block tables (blocks.py, over
cbsim/kv_blocks.py), admission (admission.py: the waiting queue), steady decode (decode.py: the
fast path) and token update (update.py: tokens in, finished requests out, in step order).

This file owns what ties them together: the running queue (admission order), the step counter,
the requests awaiting their last update, and ``schedule``'s general path: running requests first,
each with its next query within ``workload.max_batch_tokens``, preempting from the back when
blocks run out, then admission, then the batch. The contract and the whole policy: the package
docstring (cbsim/scheduler/__init__.py) and docs/architecture.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sized

import numpy as np

from cbsim.config.schema import WorkloadConfig
from cbsim.kv_blocks import KVBlockManager
from cbsim.scheduler.admission import Admission
from cbsim.scheduler.batch import _EMPTY_I64, Batch
from cbsim.scheduler.blocks import BlockTables
from cbsim.scheduler.decode import SteadyDecode
from cbsim.scheduler.inputs import batch_inputs
from cbsim.scheduler.table import (
    DRAINING,
    FINISHED,
    REASONS,
    RUNNING,
    WAITING,
    RequestState,
    RequestTable,
)
from cbsim.scheduler.update import TokenUpdate
from cbsim.workload import Request


class Scheduler:
    """Continuous-batching scheduler over a paged KV cache of ``num_kv_blocks`` blocks of
    ``workload.kv_block_size`` tokens (``None``: ``workload.kv_num_blocks``, which must then be
    set; see ``default_num_kv_blocks``). ``eos_token_id`` ends a request early unless
    ``workload.ignore_eos``. Requests are identified by their ``rid`` (any int, unique).
    ``keep_tokens=False`` (the simulator, which reads no id): a request is a row of counts and
    its latest output, and batches carry 0 for prompt and recompute ids; the same batches."""

    def __init__(
        self,
        workload: WorkloadConfig,
        num_kv_blocks: int | None = None,
        eos_token_id: int | None = None,
        keep_tokens: bool = True,
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
        self.kv = KVBlockManager(num_kv_blocks, self.block_size)
        self.table = RequestTable(keep_tokens)
        self.blocks = BlockTables(self.kv, self.table)
        self.admission = Admission(
            self.table, self.blocks, self.max_batch_tokens, self.chunked_prefill
        )
        eos = None if workload.ignore_eos else eos_token_id
        self.updates = TokenUpdate(self.table, eos, self._retire)
        self.run = _EMPTY_I64  # running (schedulable) rows, admission order
        self.draining = 0  # last output scheduled, awaiting the update that retires them
        self.unfinished = 0
        self.step = 0  # step of the next batch
        self.num_preemptions = 0
        self.decode = SteadyDecode(self)

    # ------------------------------------------------------------------ requests

    def add(self, request: Request) -> None:
        """Queue a request. Requests are admitted FIFO; one that arrives earlier than the
        last queued one is slotted in by arrival time."""
        rid = int(request.rid)
        if self.table.has(rid):
            raise ValueError(f"request {rid} added twice")
        # without keep_tokens the prompt's ids are never read (a drawn request never draws them)
        prompt = np.asarray(request.prompt_ids) if self.table.keep_tokens else None
        plen = int(request.prompt_len) if prompt is None else int(prompt.size)
        maxnew = int(request.max_new_tokens)
        if plen < 1 or maxnew < 1:
            raise ValueError(
                f"request {rid}: prompt length {plen} and max_new_tokens {maxnew} must be >= 1"
            )
        need = self.kv.blocks_needed(plen + maxnew - 1)
        if need > self.kv.num_blocks:
            raise ValueError(
                f"request {rid}: prompt {plen} + max_new_tokens {maxnew} needs {need} KV blocks; "
                f"the cache has {self.kv.num_blocks} (of {self.block_size} tokens)"
            )
        if not self.chunked_prefill and plen > self.max_batch_tokens:
            raise ValueError(
                f"request {rid}: prompt {plen} tokens exceeds workload.max_batch_tokens="
                f"{self.max_batch_tokens} with chunked_prefill off"
            )
        i = self.table.append(rid, float(request.arrival_s), plen, prompt, maxnew)
        self.unfinished += 1
        self.admission.queue(i)

    def add_all(self, requests: Iterable[Request]) -> None:
        if isinstance(requests, Sized):  # rows for all at once, not doubling past them
            self.table.reserve(self.table.n + len(requests))
        for r in requests:
            self.add(r)

    # ------------------------------------------------------------------ queries

    @property
    def eos_token_id(self) -> int | None:
        return self.updates.eos_token_id

    @property
    def fast_path(self) -> bool:
        """Steady decode takes the fast path (False: the general path only, for tests)."""
        return self.decode.enabled

    @fast_path.setter
    def fast_path(self, on: bool) -> None:
        self.decode.enabled = bool(on)

    @property
    def last_first_token_rids(self) -> list[int]:
        return self.updates.last_first_token_rids

    @property
    def last_num_kept(self) -> int:
        return self.updates.last_num_kept

    def has_unfinished(self) -> bool:
        """Any request not yet retired by update() (waiting, running or awaiting its update)."""
        return self.unfinished > 0

    def next_arrival_s(self) -> float:
        """Arrival time of the head of the waiting queue (inf when nobody waits). Admission is
        FIFO, so this is when ``schedule`` can next admit someone; when it is <= now and
        ``schedule`` returned None, only an ``update`` (tokens, freed blocks) can unblock it."""
        return self.admission.next_arrival_s()

    @property
    def num_waiting(self) -> int:
        return len(self.admission.waiting)

    @property
    def num_running(self) -> int:
        """Admitted and not retired: running plus those whose last output awaits its update."""
        return int(self.run.size) + self.draining

    @property
    def kv_blocks_used(self) -> int:
        return self.kv.num_used

    @property
    def num_unfinished(self) -> int:
        return self.unfinished

    @property
    def steps_scheduled(self) -> int:
        return self.step

    def counters(self) -> dict[str, int]:
        """The trace's scheduler counter track: waiting, running, kv_blocks_used."""
        return {
            "waiting": self.num_waiting,
            "running": self.num_running,
            "kv_blocks_used": self.kv.num_used,
        }

    def outputs(self, rid: int) -> np.ndarray:
        """The outputs of a request filled in so far (int64); a RuntimeError without
        ``keep_tokens`` (``num_outputs`` counts them)."""
        return self.table.outputs(self.table.row(rid))

    def num_outputs(self, rid: int) -> int:
        """Outputs filled in so far (cheap: no copy of the tokens)."""
        return int(self.table.nfilled[self.table.row(rid)])

    def finish_reason(self, rid: int) -> str:
        """ "length" | "eos" once retired, else "" (cheap: no snapshot)."""
        return REASONS[self.table.reason[self.table.row(rid)]]

    def request(self, rid: int) -> RequestState:
        """A snapshot of one request (copies its outputs, when kept)."""
        self.decode.sync()
        return self.table.snapshot(self.table.row(rid))

    def rids(self) -> list[int]:
        return self.table.rid[: self.table.n].tolist()

    def held_blocks(self) -> dict[int, np.ndarray]:
        """KV block ids each request holds now (for checks; not for the hot path)."""
        return self.blocks.held()

    # ------------------------------------------------------------------ schedule and update

    def schedule(self, now_s: float = math.inf) -> Batch | None:
        """The next batch, or None when nothing can run now (see ``next_arrival_s``)."""
        dec = self.decode
        if dec.active and dec.enabled:
            batch = dec.schedule(now_s)
            if batch is not None:
                return batch
        dec.sync()
        dec.active = False
        run_sel, q, preempted = self._schedule_running()
        budget = self.max_batch_tokens - int(q.sum())
        run = self.run
        adm: list[int] = []
        # a step that preempted admits nobody (no thrashing), unless nothing else runs
        if (not preempted or not run_sel.size) and budget > 0 and run.size < self.batch_size:
            adm, adm_q = self.admission.admit(now_s, budget, int(run.size), self.batch_size)
        if adm:
            adm_arr = np.asarray(adm, dtype=np.int64)
            idx = np.concatenate((run_sel, adm_arr))
            q = np.concatenate((q, np.asarray(adm_q, dtype=np.int64)))
            run = np.concatenate((run, adm_arr))
        else:
            idx = run_sel
        if idx.size == 0:
            self.run = run
            if not (run.size or self.draining or self.updates.next_step != self.step):
                self.admission.check_stuck(now_s, self.max_batch_tokens)  # nothing in flight
            return None
        return self._commit(idx, q, run)

    def update(self, batch: Batch, tokens: np.ndarray) -> list[int]:
        """Fill in ``batch``'s sampled tokens (one per ``sample`` == True entry, in order) and
        retire finished requests; returns their rids. Batches are updated in step order. Outputs
        of requests already retired by EOS are dropped."""
        return self.updates.update(batch, tokens)

    # ------------------------------------------------------------------ the general path

    def _schedule_running(self) -> tuple[np.ndarray, np.ndarray, bool]:
        """Each running request's next query within the budget, its blocks granted (preempting
        from the back when they run out); (rows, query tokens, whether it preempted)."""
        run, t = self.run, self.table
        if not run.size:
            return _EMPTY_I64, _EMPTY_I64, False
        budget = self.max_batch_tokens
        nc = t.computed[run]
        rem = t.plen[run] + t.nsched[run] - nc
        if run.size <= budget and int(rem.max()) == 1:
            q = rem
        else:
            before = np.cumsum(rem) - rem
            q = np.clip(budget - before, 0, rem)
        nblk = t.nblk[run]
        need = (nc + q + (self.block_size - 1)) // self.block_size - nblk
        total = int(need.sum())
        if total > self.kv.num_free:
            before_preemptions = self.num_preemptions
            run_sel, q = self._schedule_running_slow(budget)
            return run_sel, q, self.num_preemptions != before_preemptions
        if total:
            self.blocks.grant(run, need, total, nblk)
        if q is not rem and not q.all():
            keep = q > 0
            return run[keep], q[keep], False
        return run, q, False

    def _schedule_running_slow(self, budget: int) -> tuple[np.ndarray, np.ndarray]:
        """Running requests one at a time, preempting from the back when blocks run out."""
        t = self.table
        run = self.run.tolist()
        sel: list[int] = []
        qs: list[int] = []
        bs = self.block_size
        j = 0
        while j < len(run) and budget > 0:
            i = run[j]
            nc = int(t.computed[i])
            qi = min(int(t.plen[i] + t.nsched[i]) - nc, budget)
            need = (nc + qi + bs - 1) // bs - int(t.nblk[i])
            while need > self.kv.num_free:
                victim = run.pop()
                self._preempt(victim)
                if victim == i:
                    break
            if j >= len(run) or run[j] != i:
                break  # preempted itself
            if need:
                self.blocks.extend(i, need)
            sel.append(i)
            qs.append(qi)
            budget -= qi
            j += 1
        self.run = np.asarray(run, dtype=np.int64)
        return np.asarray(sel, dtype=np.int64), np.asarray(qs, dtype=np.int64)

    def _preempt(self, i: int) -> None:
        """Recompute preemption: free the blocks, back to the front of the waiting queue."""
        t = self.table
        self.blocks.free(i)
        t.computed[i] = 0
        t.state[i] = WAITING
        t.npreempt[i] += 1
        self.num_preemptions += 1
        self.admission.requeue(i)

    def _commit(self, idx: np.ndarray, q: np.ndarray, run: np.ndarray) -> Batch:
        """Commit progress optimistically (KV grows by the query, each sampled position adds
        one pending output) and build the batch."""
        t = self.table
        start = t.computed[idx]
        plen = t.plen[idx]
        ctx = start + q
        n = idx.size
        sample = ctx == plen + t.nsched[idx]
        all_sample = bool(sample.all())
        num_decode, input_ids, placeholder, query_tokens = batch_inputs(
            t, idx, q, start, plen, sample, all_sample
        )
        t.computed[idx] = ctx
        sidx = idx if all_sample else idx[sample]
        finishing, run = self._sampled(sidx, run)
        self.run = run
        step = self.step
        self.step = step + 1
        num_prefill = n - num_decode
        fields = {
            "idx": idx,
            "rids": t.rid[idx],
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
            "_seg": t.seg[idx],
        }
        batch = Batch(
            step=step,
            start_pos=start,
            context_lens=ctx,
            placeholder=placeholder,
            input_ids=input_ids,
            query_tokens=query_tokens,
            kv_tokens=int(ctx.sum()),
            _flat=self.blocks.flat,
            **fields,
        )
        # every running request sampled: the next steps are pure decode of the survivors,
        # which the steady path runs without recomputing what stays put
        self.decode.active = False
        if all_sample and idx.size == run.size + finishing.size:
            keep = None if not finishing.size else t.state[idx] == RUNNING
            self.decode.enter(idx, fields, ctx, keep)
        return batch

    def _sampled(self, sidx: np.ndarray, run: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One more pending output for each sampled row; who of them scheduled their last one
        leaves the running queue (draining until its update). (finishing rows, running queue)"""
        t = self.table
        ns = t.nsched[sidx] + 1
        t.nsched[sidx] = ns
        done = ns == t.maxnew[sidx]
        if not done.any():
            return _EMPTY_I64, run
        finishing = sidx[done]
        t.state[finishing] = DRAINING
        self.draining += int(finishing.size)
        return finishing, run[t.state[run] == RUNNING]

    def _retire(self, i: int, step: int, reason: int) -> None:
        """Row ``i`` is done (reason 1: length, 2: EOS): out of its queue, its blocks freed."""
        t = self.table
        st = t.state[i]
        if st == RUNNING:
            self.decode.sync()
            self.run = self.run[self.run != i]
            self.decode.active = False
        elif st == WAITING:
            self.admission.waiting.remove(i)
        elif st == DRAINING:
            self.draining -= 1
        self.blocks.free(i)
        t.state[i] = FINISHED
        t.finish[i] = step
        t.reason[i] = reason
        self.unfinished -= 1
