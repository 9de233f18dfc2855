"""The continuous-batching scheduler both back ends drive: one scheduler, two clocks.

No time and no device here: the simulator calls it from a SimPy process, the runtime from its host
loop, in the same order (docs/architecture.md, "The scheduler contract"):

- sync, per step: ``batch = schedule(now)``, run the forward, ``update(batch, tokens)``;
- async: ``b0 = schedule()``, launch b0, then loop: ``b1 = schedule()`` (b0's tokens unknown),
  launch b1, wait for b0's tokens, ``update(b0, tokens0)``, ``b0 = b1``.

Policy (vLLM V1 / nano-vllm): running requests first, in admission order, each with its next
query (one decode token, or its next prefill chunk), then waiting requests FIFO while
``workload.batch_size`` (running requests) and ``workload.max_batch_tokens`` (query tokens per step)
allow. KV blocks are allocated at schedule time for the tokens being computed; admission waits for
blocks; a running request that cannot get the block it needs preempts by recompute from the back
of the running queue (blocks freed, request back at the front of the waiting queue; re-admitted
later with prompt + outputs so far as its prompt, all re-prefilled). A step that preempted admits
nobody. Without ``workload.chunked_prefill`` a prompt must fit whole into the step's remaining
budget (a recompute longer than ``max_batch_tokens`` is chunked anyway: it could never run
otherwise).

Progress is committed optimistically: ``schedule`` grows each request's KV length by its query
tokens, and a sampled position adds one *pending* output; ``update`` fills pending outputs in and
retires finished requests, freeing their blocks (for later ``schedule`` calls only). A request
stops being scheduled once its last output (``max_new_tokens``) is scheduled; it leaves the
running queue then (its batch slot is free for the next ``schedule``) and keeps its blocks until
the ``update`` of that batch retires it. With EOS on (``ignore_eos`` false and an
``eos_token_id``), ``update`` of batch N retires a request that sampled EOS (the EOS token is its
last output); the request may already sit in batch N+1, and ``update`` of N+1 drops that output.
Freeing blocks that an in-flight batch still touches is safe because batches run in order on one
compute stream: a later batch that reuses the blocks writes them after the earlier one is done.
A preempted request with a pending output is re-admitted only after the ``update`` that fills it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from cbsim.config.schema import WorkloadConfig
from cbsim.kv_blocks import KVBlockManager
from cbsim.workload import Request

WAITING, RUNNING, DRAINING, FINISHED = 0, 1, 2, 3
_STATUS = ("waiting", "running", "finishing", "finished")
_REASONS = ("", "length", "eos")

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


@dataclass
class RequestState:
    """A snapshot of one request as the scheduler sees it (for request events and checks)."""

    rid: int
    arrival_s: float
    prompt_len: int
    max_new_tokens: int
    status: str  # "waiting" | "running" | "finishing" (last output scheduled) | "finished"
    outputs: np.ndarray  # int64, the outputs filled in so far (the EOS token included)
    num_scheduled: int  # outputs committed by schedule(), pending ones included
    first_token_step: int  # step of the batch that produced output 0; -1 before
    finish_step: int  # step of the batch whose update() retired it; -1 before
    finish_reason: str  # "" | "length" | "eos"
    num_preemptions: int

    @property
    def num_outputs(self) -> int:
        return int(self.outputs.size)


class Scheduler:
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

    # ------------------------------------------------------------------ requests

    def _grow(self, cap: int) -> None:
        def g(name: str, dtype: type, fill: int | float = 0) -> None:
            new = np.full(cap, fill, dtype=dtype)
            if self._cap:
                new[: self._cap] = getattr(self, name)
            setattr(self, name, new)

        g("_rid", np.int64)
        g("_arrival", np.float64)
        g("_plen", np.int64)
        g("_maxnew", np.int64)
        g("_computed", np.int64)  # KV tokens committed (scheduled), pending included
        g("_nsched", np.int64)  # outputs committed by schedule()
        g("_nfilled", np.int64)  # outputs filled by update()
        g("_lasttok", np.int64)  # the last filled output
        g("_seg", np.int64)  # this admission's segment in the flat block table
        g("_nblk", np.int64)  # blocks held
        g("_state", np.int8, WAITING)
        g("_first", np.int64, -1)
        g("_finish", np.int64, -1)
        g("_reason", np.int8)
        g("_npreempt", np.int64)
        g("_outoff", np.int64, -1)  # segment in the output buffer; -1: none yet
        self._cap = cap

    def add(self, request: Request) -> None:
        """Queue a request. Requests are admitted FIFO; one that arrives earlier than the
        last queued one is slotted in by arrival time."""
        rid = int(request.rid)
        if rid in self._index:
            raise ValueError(f"request {rid} added twice")
        prompt = np.asarray(request.prompt_ids)
        plen, maxnew = int(prompt.size), int(request.max_new_tokens)
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
        if self._n == self._cap:
            self._grow(2 * self._cap)
        i = self._n
        self._n += 1
        self._index[rid] = i
        self._prompts.append(prompt)
        self._rid[i] = rid
        self._arrival[i] = float(request.arrival_s)
        self._plen[i] = plen
        self._maxnew[i] = maxnew
        self._unfinished += 1
        w = self._waiting
        if w and self._arrival[w[-1]] > self._arrival[i]:
            pos = len(w)
            while pos > 0 and self._arrival[w[pos - 1]] > self._arrival[i]:
                pos -= 1
            w.insert(pos, i)
        else:
            w.append(i)

    def add_all(self, requests: Iterable[Request]) -> None:
        for r in requests:
            self.add(r)

    # ------------------------------------------------------------------ queries

    def has_unfinished(self) -> bool:
        """Any request not yet retired by update() (waiting, running or awaiting its update)."""
        return self._unfinished > 0

    def next_arrival_s(self) -> float:
        """Arrival time of the head of the waiting queue (inf when nobody waits). Admission is
        FIFO, so this is when ``schedule`` can next admit someone; when it is <= now and
        ``schedule`` returned None, only an ``update`` (tokens, freed blocks) can unblock it."""
        return float(self._arrival[self._waiting[0]]) if self._waiting else math.inf

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        """Admitted and not retired: running plus those whose last output awaits its update."""
        return int(self._run.size) + self._draining

    @property
    def kv_blocks_used(self) -> int:
        return self.kv.num_used

    @property
    def num_unfinished(self) -> int:
        return self._unfinished

    @property
    def steps_scheduled(self) -> int:
        return self._step

    def counters(self) -> dict[str, int]:
        """The trace's scheduler counter track: waiting, running, kv_blocks_used."""
        return {
            "waiting": self.num_waiting,
            "running": self.num_running,
            "kv_blocks_used": self.kv.num_used,
        }

    def outputs(self, rid: int) -> np.ndarray:
        """The outputs of a request filled in so far (int64)."""
        i = self._index[rid]
        self._flush_log()
        n = int(self._nfilled[i])
        off = int(self._outoff[i])
        return self._outbuf[off : off + n].copy() if n else np.empty(0, dtype=np.int64)

    def num_outputs(self, rid: int) -> int:
        """Outputs filled in so far (cheap: no copy of the tokens)."""
        return int(self._nfilled[self._index[rid]])

    def request(self, rid: int) -> RequestState:
        """A snapshot of one request (copies its outputs)."""
        i = self._index[rid]
        self._sync_steady()
        return RequestState(
            rid=rid,
            arrival_s=float(self._arrival[i]),
            prompt_len=int(self._plen[i]),
            max_new_tokens=int(self._maxnew[i]),
            status=_STATUS[self._state[i]],
            outputs=self.outputs(rid),
            num_scheduled=int(self._nsched[i]),
            first_token_step=int(self._first[i]),
            finish_step=int(self._finish[i]),
            finish_reason=_REASONS[self._reason[i]],
            num_preemptions=int(self._npreempt[i]),
        )

    def rids(self) -> list[int]:
        return self._rid[: self._n].tolist()

    def held_blocks(self) -> dict[int, np.ndarray]:
        """KV block ids each request holds now (for checks; not for the hot path)."""
        return {
            int(self._rid[i]): self._flat[self._seg[i] : self._seg[i] + self._nblk[i]].copy()
            for i in np.flatnonzero(self._nblk[: self._n]).tolist()
        }

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

    def _free_blocks(self, i: int) -> None:
        nb = int(self._nblk[i])
        if nb:
            seg = int(self._seg[i])
            self.kv.free(self._flat[seg : seg + nb])
            self._nblk[i] = 0

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

    # ------------------------------------------------------------------ update

    def update(self, batch: Batch, tokens: np.ndarray) -> list[int]:
        """Fill in ``batch``'s sampled tokens (one per ``sample`` == True entry, in order) and
        retire finished requests; returns their rids. Batches are updated in step order. Outputs
        of requests already retired by EOS are dropped."""
        if batch.step != self._next_update:
            raise RuntimeError(
                f"update of step {batch.step} out of order; the next to update is step "
                f"{self._next_update}"
            )
        idx = batch.sample_idx
        tok = np.array(tokens, dtype=np.int64)  # a copy: callers reuse their buffers
        if tok.ndim != 1:
            tok = tok.reshape(-1)
        if tok.size != idx.size:
            raise ValueError(
                f"update of step {batch.step}: {tok.size} tokens for {idx.size} sampled positions"
            )
        self._next_update += 1
        if self._eos_finished and idx.size:
            live = self._state[idx] != FINISHED
            if not live.all():
                idx, tok = idx[live], tok[live]
        if self.last_first_token_rids:
            self.last_first_token_rids = []
        if idx.size:
            if batch.num_prefill:
                new = self._nfilled[idx] == 0
                if new.any():
                    self._first[idx[new]] = batch.step
                    self.last_first_token_rids = self._rid[idx[new]].tolist()
            self._nfilled[idx] += 1
            self._lasttok[idx] = tok
            self._log.append((idx, tok))
        finished: list[int] = []
        if self.eos_token_id is not None and idx.size:
            hit = tok == self.eos_token_id
            if hit.any():
                for i in idx[hit].tolist():
                    self._retire(i, batch.step, 2)
                    finished.append(int(self._rid[i]))
                self._eos_finished = True
        fin = batch.finishing
        if fin.size:
            for i in fin.tolist():
                if self._state[i] == DRAINING:
                    self._retire(i, batch.step, 1)
                    finished.append(int(self._rid[i]))
        return finished

    def _retire(self, i: int, step: int, reason: int) -> None:
        st = self._state[i]
        if st == RUNNING:
            self._sync_steady()
            self._run = self._run[self._run != i]
            self._steady = False
        elif st == WAITING:
            self._waiting.remove(i)
        elif st == DRAINING:
            self._draining -= 1
        self._free_blocks(i)
        self._state[i] = FINISHED
        self._finish[i] = step
        self._reason[i] = reason
        self._unfinished -= 1

    def _flush_log(self) -> None:
        """Move logged outputs into the flat output buffer (they arrive in order per request)."""
        if not self._log:
            return
        idx = np.concatenate([a for a, _ in self._log])
        tok = np.concatenate([t for _, t in self._log])
        self._log = []
        order = np.argsort(idx, kind="stable")
        idx, tok = idx[order], tok[order]
        n = idx.size
        first = np.empty(n, dtype=bool)
        first[0] = True
        np.not_equal(idx[1:], idx[:-1], out=first[1:])
        starts = np.flatnonzero(first)
        counts = np.diff(np.append(starts, n))
        uniq = idx[starts]
        new = uniq[self._outoff[uniq] < 0]
        if new.size:  # first outputs of these requests: give each a max_new_tokens segment
            caps = self._maxnew[new]
            self._outoff[new] = self._outbuf_top + np.cumsum(caps) - caps
            top = self._outbuf_top + int(caps.sum())
            if top > self._outbuf.size:
                grown = np.zeros(max(top, 2 * self._outbuf.size), dtype=np.int64)
                grown[: self._outbuf_top] = self._outbuf[: self._outbuf_top]
                self._outbuf = grown
            self._outbuf_top = top
        # the logged outputs of a request are its last `count` filled ones, in order
        rank = np.arange(n) - np.repeat(starts, counts)
        pos = self._outoff[idx] + self._nfilled[idx] - np.repeat(counts, counts) + rank
        self._outbuf[pos] = tok


def default_num_kv_blocks(workload: WorkloadConfig, requests: Iterable[Request]) -> int:
    """``workload.kv_num_blocks``, or (None) enough blocks for every request at once."""
    if workload.kv_num_blocks is not None:
        return int(workload.kv_num_blocks)
    bs = workload.kv_block_size
    return max(1, sum(-(-(r.prompt_len + r.max_new_tokens) // bs) for r in requests))


def run_to_completion(
    sched: Scheduler,
    sample: Callable[[Batch], np.ndarray],
    overlap: bool = False,
    on_batch: Callable[[Batch, Batch | None], None] | None = None,
) -> int:
    """The reference driver (tests, benchmarks): offline, every request already added.
    ``overlap`` = the async order (schedule N+1 before update N). ``sample(batch)`` returns the
    batch's tokens; it runs when the batch's forward would finish, i.e. after the next batch has
    been scheduled in the async order. ``on_batch(batch, prev)`` sees every batch as it is
    scheduled. Returns the number of steps."""
    steps = 0
    prev: Batch | None = None
    while sched.has_unfinished():
        batch = sched.schedule()  # raises when nothing can ever run
        if batch is not None:
            steps += 1
            if on_batch is not None:
                on_batch(batch, prev)
        if not overlap:
            if batch is not None:
                sched.update(batch, sample(batch))
            continue
        if prev is not None:
            sched.update(prev, sample(prev))
        prev = batch
    if prev is not None:  # outputs of requests already retired (EOS): dropped
        sched.update(prev, sample(prev))
    return steps
