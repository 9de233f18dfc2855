"""The update half of the scheduler contract: fill a batch's sampled tokens in, retire finished
requests (length or EOS) and free their blocks.

``TokenUpdate`` is a mixin of ``Scheduler`` (cbsim/scheduler/policy.py), whose ``__init__``
declares the state it reads and writes.
"""

from __future__ import annotations

import numpy as np

from cbsim.scheduler.batch import Batch
from cbsim.scheduler.state import DRAINING, FINISHED, RUNNING, WAITING


class TokenUpdate:
    """``update`` and ``_retire`` (a ``Scheduler`` mixin)."""

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
        self.last_num_kept = int(idx.size)
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
