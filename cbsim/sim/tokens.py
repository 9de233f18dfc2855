"""What the simulated GPU samples: token ids only matter for stopping (EOS).

EOS off (``workload.ignore_eos``, the reported workload): a constant id that is never EOS; every
request runs to its drawn generation length, which the scheduler knows (``max_new_tokens``).

EOS on: a request samples EOS as the last of its drawn length of tokens. A server cannot know
where that falls, so the scheduler is told one more token may come (``max_new_tokens`` + 1): the
sync engine never notices, but the async engine has already scheduled the step after the EOS by
the time it sees it; that output is computed and dropped (``dropped_tokens``). cbsim.run_setup grants the extra token
(``eos_headroom``).
"""

from __future__ import annotations

import numpy as np

from cbsim.workload import Request

KEEP_TOKEN = 1  # any id that is not EOS


class Sampler:
    """Tokens for each batch's sampled positions, and how many of them a request keeps."""

    def __init__(
        self, requests: list[Request], ignore_eos: bool, vocab_size: int, batch_size: int
    ) -> None:
        self.eos_id = None if ignore_eos else vocab_size - 1
        self._const = np.full(max(batch_size, 1), KEEP_TOKEN, dtype=np.int64)
        size = max(r.rid for r in requests) + 1 if requests else 0
        self.length = np.zeros(size, dtype=np.int64)
        self.count = np.zeros(size, dtype=np.int64)
        for r in requests:
            self.length[r.rid] = r.max_new_tokens

    def sample(self, batch) -> tuple[np.ndarray, int]:
        """(tokens in sample order, how many of them are kept)."""
        n = batch.num_samples
        if self.eos_id is None:
            return self._const[:n], n
        rids = batch.sample_rids
        live = self.count[rids] < self.length[rids]  # not past its EOS already
        self.count[rids[live]] += 1
        tokens = np.full(n, KEEP_TOKEN, dtype=np.int64)
        tokens[live & (self.count[rids] == self.length[rids])] = self.eos_id
        return tokens, int(np.count_nonzero(live))

    def eos_room(self, rids: np.ndarray) -> int:
        """Updates of these requests that sample no EOS (a large number with EOS off)."""
        if self.eos_id is None or not rids.size:
            return 1 << 62
        return int((self.length[rids] - self.count[rids]).min()) - 1

    def skip(self, rids: np.ndarray, k: int) -> None:
        """``k`` samples of these requests, none of them EOS (``eos_room`` allows them)."""
        if self.eos_id is not None:
            self.count[rids] += k
