"""The update half of the scheduler contract: fill a batch's sampled tokens in and say which
requests finish (length or EOS); the scheduler retires them and frees their blocks.

Batches are updated in step order; this part owns that order (``next_step``) and what the last
update did (``last_first_token_rids``, ``last_num_kept``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cbsim.scheduler.batch import Batch
from cbsim.scheduler.table import DRAINING, FINISHED, RequestTable

# (row, step, reason): 1 = length, 2 = eos
Retire = Callable[[int, int, int], None]


class TokenUpdate:
    """Tokens in, finished requests out."""

    def __init__(self, table: RequestTable, eos_token_id: int | None, retire: Retire) -> None:
        self.table = table
        self.eos_token_id = eos_token_id
        self.retire = retire
        self.next_step = 0  # step of the next batch to update
        self.eos_finished = False  # some request retired by EOS: batches may hold stale entries
        self.last_first_token_rids: list[int] = []  # rids whose output 0 the last update filled
        self.last_num_kept = 0  # tokens the last update kept (outputs after an EOS: dropped)

    def update(self, batch: Batch, tokens: np.ndarray) -> list[int]:
        """Fill in ``batch``'s sampled tokens (one per ``sample`` == True entry, in order) and
        retire finished requests; returns their rids. Outputs of requests already retired by
        EOS are dropped."""
        if batch.step != self.next_step:
            raise RuntimeError(
                f"update of step {batch.step} out of order; the next to update is step "
                f"{self.next_step}"
            )
        idx = batch.sample_idx
        tok = np.array(tokens, dtype=np.int64)  # a copy: callers reuse their buffers
        if tok.ndim != 1:
            tok = tok.reshape(-1)
        if tok.size != idx.size:
            raise ValueError(
                f"update of step {batch.step}: {tok.size} tokens for {idx.size} sampled positions"
            )
        self.next_step += 1
        t = self.table
        if self.eos_finished and idx.size:
            live = t.state[idx] != FINISHED
            if not live.all():
                idx, tok = idx[live], tok[live]
        self.last_num_kept = int(idx.size)
        if self.last_first_token_rids:
            self.last_first_token_rids = []
        if idx.size:
            if batch.num_prefill:
                new = t.nfilled[idx] == 0
                if new.any():
                    t.first[idx[new]] = batch.step
                    self.last_first_token_rids = t.rid[idx[new]].tolist()
            t.nfilled[idx] += 1
            t.lasttok[idx] = tok
            t.log_tokens(idx, tok)
        return self._finished(batch, idx, tok)

    def _finished(self, batch: Batch, idx: np.ndarray, tok: np.ndarray) -> list[int]:
        """Retire who sampled EOS, then who sampled their last output; their rids."""
        t = self.table
        finished: list[int] = []
        if self.eos_token_id is not None and idx.size:
            hit = tok == self.eos_token_id
            if hit.any():
                for i in idx[hit].tolist():
                    self.retire(i, batch.step, 2)
                    finished.append(int(t.rid[i]))
                self.eos_finished = True
        fin = batch.finishing
        if fin.size:
            for i in fin.tolist():
                if t.state[i] == DRAINING:
                    self.retire(i, batch.step, 1)
                    finished.append(int(t.rid[i]))
        return finished

    def skip(self, rows: np.ndarray, k: int, token: int) -> None:
        """``k`` updates of steady decode batches of ``rows`` (none finishing, no first token,
        every token ``token``): the state ``update`` would leave, without the batches."""
        t = self.table
        self.next_step += k
        self.last_num_kept = int(rows.size)
        if self.last_first_token_rids:
            self.last_first_token_rids = []
        t.nfilled[rows] += k
        t.lasttok[rows] = token
        if t.keep_tokens:  # one token value: each row's k outputs side by side, as update logs
            t.log_tokens(np.repeat(rows, k), np.full(rows.size * k, token, dtype=np.int64))
