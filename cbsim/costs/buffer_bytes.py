"""What the host stages per step and what the runtime allocates for it, in bytes: the inputs
copied to the GPU (io_slots.pack's layout), the tokens copied back, an IO slot, the graph pool."""

from __future__ import annotations

import math

from cbsim.costs.mixed_graphs import piece_activation_bytes

INT64, INT32 = 8, 4
# per-request int32 metadata in every batch: start position, context length, query length
REQUEST_META_BYTES = 3 * INT32
# per-sampled-request bytes: logits index (int32) + carry-over index (int32)
SAMPLE_META_BYTES = 2 * INT32


class BufferBytes:
    """CostModel's byte counts (it sets ``block_size``, ``model``, ``graph_sizes``,
    ``graph_size`` and ``token_buckets``)."""

    def h2d_bytes(self, query_tokens: int, requests: int, sampled: int, kv_blocks: int) -> int:
        """Input ids (int64) and positions (int32) per token, per-request metadata, block tables,
        logits and carry-over indices."""
        return (
            query_tokens * (INT64 + INT32)
            + requests * REQUEST_META_BYTES
            + kv_blocks * INT32
            + sampled * SAMPLE_META_BYTES
        )

    def d2h_bytes(self, sampled: int) -> int:
        return sampled * INT64  # the sampled token ids

    def io_slot_bytes(self, max_requests: int, max_tokens: int, max_context: int) -> int:
        """One IO slot: pinned host buffer + device buffer of the largest batch's inputs, plus
        the sampled-token output buffer on both sides."""
        max_blocks = math.ceil(max_context / self.block_size)
        inputs = self.h2d_bytes(max_tokens, max_requests, max_requests, max_blocks * max_requests)
        return 2 * (inputs + self.d2h_bytes(max_requests))

    def graph_pool_bytes_per_slot(self, max_requests: int) -> int:
        """Activation workspace of the largest decode graph a batch of ``max_requests`` replays
        (graphs of every size share it, as they never replay at once): hidden states, q/k/v and
        MLP intermediates in the model dtype, logits in the model dtype plus their fp32 copy for
        sampling, per padded row. (The runtime measured 24 MiB for 8B at 32 rows; this: 28 MiB.)
        With engine.mixed_graphs=buckets the pieces of the largest token bucket share it too."""
        rows = self.graph_size(max_requests) or self.graph_sizes[-1]
        m = self.model
        h, kv = m.hidden_size, m.num_kv_heads * m.head_dim
        per_row = m.dtype_bytes * (6 * h + 2 * kv + 3 * m.intermediate_size + m.vocab_size)
        pool = rows * (per_row + 4 * m.vocab_size)
        if self.token_buckets:
            pool = max(pool, piece_activation_bytes(m, self.token_buckets[-1]))
        return pool
