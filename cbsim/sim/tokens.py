"""What the simulated GPU samples: token ids only matter for stopping (EOS).

EOS off (``workload.ignore_eos``, the reported workload): a constant id that is never EOS; every
request runs to its drawn generation length, which the scheduler knows (``max_new_tokens``).

EOS on: a request samples EOS as the last of its drawn length of tokens. A server cannot know
where that falls, so the scheduler is told one more token may come (``max_new_tokens`` + 1): the
sync engine never notices, but the async engine has already scheduled the step after the EOS by
the time it sees it; that output is computed and dropped (``dropped_tokens``).
"""

from __future__ import annotations

import dataclasses

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

    def scheduler_requests(
        self, requests: list[Request], max_context: int, kv_capacity_tokens: int | None = None
    ) -> list[Request]:
        """The requests as the scheduler sees them: with EOS on, one more token allowed (where
        the context, and the KV cache of ``kv_capacity_tokens`` when it is fixed, have room for
        it: the extra token's KV entries are prompt + max_new_tokens)."""
        if self.eos_id is None:
            return requests
        room = max_context - 1
        if kv_capacity_tokens is not None:
            room = min(room, kv_capacity_tokens)
        return [
            dataclasses.replace(r, max_new_tokens=r.max_new_tokens + 1)
            if r.prompt_len + r.max_new_tokens <= room
            else r
            for r in requests
        ]

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
