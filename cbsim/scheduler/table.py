"""The per-request table: one row per request (arrays indexed by the order of ``add``), the
prompts, and the outputs (logged per update, moved into one flat buffer when someone reads them).
A table that does not keep tokens (``keep_tokens=False``: the simulator) holds the rows only: a
request's prompt and outputs are its counts and its latest output, whatever their length.

Every other part of the scheduler reads and writes these rows; this part owns them, grows them,
and answers the queries over them (``RequestState`` snapshots, outputs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WAITING, RUNNING, DRAINING, FINISHED = 0, 1, 2, 3
STATUS = ("waiting", "running", "finishing", "finished")
REASONS = ("", "length", "eos")
# updates logged before their outputs move into the flat buffer unasked
LOG_UPDATES = 1024

# name, dtype, fill: the table's columns
COLUMNS = (
    ("rid", np.int64, 0),
    ("arrival", np.float64, 0),
    ("plen", np.int64, 0),
    ("maxnew", np.int64, 0),
    ("computed", np.int64, 0),  # KV tokens committed (scheduled), pending included
    ("nsched", np.int64, 0),  # outputs committed by schedule()
    ("nfilled", np.int64, 0),  # outputs filled by update()
    ("lasttok", np.int64, 0),  # the last filled output
    ("seg", np.int64, 0),  # this admission's segment in the flat block table
    ("nblk", np.int64, 0),  # blocks held
    ("state", np.int8, WAITING),
    ("first", np.int64, -1),  # step of the batch that produced output 0
    ("finish", np.int64, -1),  # step of the batch whose update retired it
    ("reason", np.int8, 0),  # index into REASONS
    ("npreempt", np.int64, 0),
    ("outoff", np.int64, -1),  # segment in the output buffer; -1: none yet
)


@dataclass
class RequestState:
    """A snapshot of one request as the scheduler sees it (for request events and checks)."""

    rid: int
    arrival_s: float
    prompt_len: int
    max_new_tokens: int
    status: str  # "waiting" | "running" | "finishing" (last output scheduled) | "finished"
    # int64, the outputs filled in so far (the EOS token included); None: tokens not kept
    outputs: np.ndarray | None
    num_outputs: int  # outputs filled in so far
    num_scheduled: int  # outputs committed by schedule(), pending ones included
    first_token_step: int  # step of the batch that produced output 0; -1 before
    finish_step: int  # step of the batch whose update() retired it; -1 before
    finish_reason: str  # "" | "length" | "eos"
    num_preemptions: int


class RequestTable:
    """The rows (numpy columns named as in COLUMNS), prompts and outputs of every request."""

    rid: np.ndarray
    arrival: np.ndarray
    plen: np.ndarray
    maxnew: np.ndarray
    computed: np.ndarray
    nsched: np.ndarray
    nfilled: np.ndarray
    lasttok: np.ndarray
    seg: np.ndarray
    nblk: np.ndarray
    state: np.ndarray
    first: np.ndarray
    finish: np.ndarray
    reason: np.ndarray
    npreempt: np.ndarray
    outoff: np.ndarray

    def __init__(self, keep_tokens: bool = True) -> None:
        self.keep_tokens = keep_tokens
        self.n = 0
        self.cap = 0
        self.grow(64)
        self.prompts: list[np.ndarray] = []
        # the row of each rid that is not its own row (a workload's rids are 0..n-1 added in
        # order: none, so a million requests hold no dict entry each)
        self.moved: dict[int, int] = {}
        # a max_new_tokens segment per request, given at its first flush
        self.outbuf = np.zeros(0, dtype=np.int64)
        self.outbuf_top = 0
        self.log: list[tuple[np.ndarray, np.ndarray]] = []  # (rows, tokens) per update

    def grow(self, cap: int) -> None:
        for name, dtype, fill in COLUMNS:
            new = np.full(cap, fill, dtype=dtype)
            if self.cap:
                new[: self.cap] = getattr(self, name)
            setattr(self, name, new)
        self.cap = cap

    def row(self, rid: int) -> int:
        """The row of request ``rid``; a KeyError when it was never added."""
        if 0 <= rid < self.n and self.rid[rid] == rid:  # rids are unique: this row is rid's
            return int(rid)
        return self.moved[rid]

    def has(self, rid: int) -> bool:
        return (0 <= rid < self.n and self.rid[rid] == rid) or rid in self.moved

    def reserve(self, rows: int) -> None:
        """Room for ``rows`` rows in all (a known number of requests: no doubling past it)."""
        if rows > self.cap:
            self.grow(rows)

    def append(
        self, rid: int, arrival_s: float, plen: int, prompt: np.ndarray | None, max_new: int
    ) -> int:
        """A new row (waiting, nothing computed); returns its index. ``prompt``: the ids, kept
        when the table keeps tokens."""
        if self.n == self.cap:
            self.grow(2 * self.cap)
        i = self.n
        self.n += 1
        if rid != i:
            self.moved[rid] = i
        if self.keep_tokens:
            self.prompts.append(prompt)
        self.rid[i] = rid
        self.arrival[i] = arrival_s
        self.plen[i] = plen
        self.maxnew[i] = max_new
        return i

    def log_tokens(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        """Outputs of one update (in order per request), moved into the buffer when read or
        when LOG_UPDATES are waiting (a long run nobody reads outputs of keeps 8 bytes a token
        in the buffer, not two arrays a step in the log); nothing without ``keep_tokens``."""
        if not self.keep_tokens:
            return
        self.log.append((rows, tokens))
        if len(self.log) >= LOG_UPDATES:
            self.flush_log()

    def outputs(self, i: int) -> np.ndarray:
        """The outputs of row ``i`` filled in so far (int64, a copy)."""
        if not self.keep_tokens:
            raise RuntimeError(
                f"request {int(self.rid[i])}: this scheduler keeps no output tokens "
                "(keep_tokens=False); num_outputs counts them"
            )
        self.flush_log()
        n = int(self.nfilled[i])
        off = int(self.outoff[i])
        return self.outbuf[off : off + n].copy() if n else np.empty(0, dtype=np.int64)

    def snapshot(self, i: int) -> RequestState:
        return RequestState(
            rid=int(self.rid[i]),
            arrival_s=float(self.arrival[i]),
            prompt_len=int(self.plen[i]),
            max_new_tokens=int(self.maxnew[i]),
            status=STATUS[self.state[i]],
            outputs=self.outputs(i) if self.keep_tokens else None,
            num_outputs=int(self.nfilled[i]),
            num_scheduled=int(self.nsched[i]),
            first_token_step=int(self.first[i]),
            finish_step=int(self.finish[i]),
            finish_reason=REASONS[self.reason[i]],
            num_preemptions=int(self.npreempt[i]),
        )

    def flush_log(self) -> None:
        """Move logged outputs into the flat output buffer (they arrive in order per request)."""
        if not self.log:
            return
        idx = np.concatenate([a for a, _ in self.log])
        tok = np.concatenate([t for _, t in self.log])
        self.log = []
        order = np.argsort(idx, kind="stable")
        idx, tok = idx[order], tok[order]
        n = idx.size
        first = np.empty(n, dtype=bool)
        first[0] = True
        np.not_equal(idx[1:], idx[:-1], out=first[1:])
        starts = np.flatnonzero(first)
        counts = np.diff(np.append(starts, n))
        uniq = idx[starts]
        new = uniq[self.outoff[uniq] < 0]
        if new.size:  # first outputs of these requests: give each a max_new_tokens segment
            caps = self.maxnew[new]
            self.outoff[new] = self.outbuf_top + np.cumsum(caps) - caps
            top = self.outbuf_top + int(caps.sum())
            if top > self.outbuf.size:
                grown = np.zeros(max(top, 2 * self.outbuf.size), dtype=np.int64)
                grown[: self.outbuf_top] = self.outbuf[: self.outbuf_top]
                self.outbuf = grown
            self.outbuf_top = top
        # the logged outputs of a request are its last `count` filled ones, in order
        rank = np.arange(n) - np.repeat(starts, counts)
        pos = self.outoff[idx] + self.nfilled[idx] - np.repeat(counts, counts) + rank
        self.outbuf[pos] = tok
