"""The per-request table: request states, the arrays indexed by the scheduler's internal index
(order of ``add``), the flat output buffer, and the queries over them (``RequestState`` snapshots,
counters, outputs, held blocks).

``RequestTable`` is a mixin of ``Scheduler`` (cbsim/scheduler/policy.py), whose ``__init__``
declares all the state; the steady path's ``_sync_steady`` writes back counters before a read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from cbsim.workload import Request

WAITING, RUNNING, DRAINING, FINISHED = 0, 1, 2, 3
_STATUS = ("waiting", "running", "finishing", "finished")
_REASONS = ("", "length", "eos")


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


class RequestTable:
    """Per-request arrays and queries (a ``Scheduler`` mixin: the state is its ``__init__``'s)."""

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

    # ------------------------------------------------------------------ blocks and outputs

    def _free_blocks(self, i: int) -> None:
        nb = int(self._nblk[i])
        if nb:
            seg = int(self._seg[i])
            self.kv.free(self._flat[seg : seg + nb])
            self._nblk[i] = 0

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
