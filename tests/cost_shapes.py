"""A step's shape as the cost model reads it, without a scheduler (tests of cbsim.costs)."""

from __future__ import annotations

import numpy as np


class Shape:
    """What CostModel.forward reads from a scheduler Batch."""

    def __init__(self, query_lens, context_lens, kind="decode"):
        self.query_lens = np.asarray(query_lens, dtype=np.int64)
        self.context_lens = np.asarray(context_lens, dtype=np.int64)
        self.start_pos = self.context_lens - self.query_lens
        self.query_tokens = int(self.query_lens.sum())
        self.kv_tokens = int(self.context_lens.sum())
        self.num_samples = self.num_requests = len(self.query_lens)
        self.kind = kind

    def __len__(self):
        return self.num_requests
