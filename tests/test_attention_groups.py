"""Short continuations attend as decode rows, a row per token, in both back ends: the groups
(cbsim/costs/attention_groups.py), the runtime's packed layout and the cost model's price."""

from __future__ import annotations

import numpy as np
import pytest
from cost_shapes import Shape

from cbsim.api import compose
from cbsim.costs import CostModel
from cbsim.costs.attention_groups import attention_groups, max_decode_rows

# a decode row (context 300), a 3-token continuation after 10 cached tokens, a 50-token one
# after 4000, a prompt chunk from position 0
Q = np.array([1, 3, 50, 20])
CTX = np.array([300, 13, 4050, 20])
START = CTX - Q


@pytest.mark.parametrize("short_max", [0, 3, 64])
def test_groups_put_each_short_continuation_token_in_the_decode_rows(short_max):
    g = attention_groups(Q, START, CTX, short_max)
    assert g.fresh.tolist() == [3]
    rows = {0: [300]}
    if short_max >= 3:
        rows[1] = [11, 12, 13]  # token i of the chunk sees its prefix and tokens 0..i
    if short_max >= 50:
        rows[2] = list(range(4001, 4051))
    got: dict[int, list[int]] = {}
    for req, off, ctx in zip(g.dec_req, g.dec_off, g.dec_ctx):
        got.setdefault(int(req), []).append(int(ctx))
        assert ctx == START[req] + off + 1 or Q[req] == 1
    assert got == rows
    assert g.ext.tolist() == [i for i in (1, 2) if i not in rows]


def test_the_runtime_packs_the_rows_the_cost_model_prices():
    torch = pytest.importorskip("torch")
    from cbsim.runtime.io_slots import pack

    class Batch:  # what pack reads of a scheduler Batch
        query_lens, start_pos, context_lens = Q, START, CTX
        cu_query_lens = np.concatenate([[0], np.cumsum(Q)])
        block_size, query_tokens, num_samples = 16, int(Q.sum()), 4
        input_ids = positions = slot_mapping = np.zeros(int(Q.sum()), np.int64)
        logits_indices = np.arange(4)

        def __len__(self):
            return 4

        def block_table_array(self, width, pad):
            return np.arange(4 * 260).reshape(4, 260)

    flat, layout = pack(Batch(), 63, None, 0, short_max=3)
    # the IO slot the runner sizes for these (a row per request, plus the short chunks' tokens)
    from cbsim.runtime.io_slots import slot_capacity

    assert layout.total <= slot_capacity(int(Q.sum()), max_decode_rows(4, int(Q.sum()), 3), 260)
    v = layout.views(torch.from_numpy(flat))
    g = attention_groups(Q, START, CTX, 3)
    assert v["dec_ctx"].tolist() == g.dec_ctx.tolist()
    assert v["dec_tok"].tolist() == [0, 1, 2, 3]  # request 0's token, then request 1's three
    assert v["dec_bt"][:, 0].tolist() == [0, 260, 260, 260]
    assert v["ext_qlen"].tolist() == [50] and layout.ext_qmax == 50


def test_a_short_continuation_costs_decode_rows_not_the_masked_walk():
    """A 9-token continuation after 4000 cached tokens beside 15 decode rows (8B shape): as
    decode rows it costs a few decode rows more than the decode rows alone; through the masked
    path it walks the whole table (the fitted default profile's walk); the kernel count drops
    the masked path's kernels."""
    step = Shape([1] * 15 + [9], [4000] * 15 + [4009], kind="mixed")
    alone = Shape([1] * 15, [4000] * 15, kind="mixed")

    def model(short_max):
        return CostModel(compose("model=llama3_8b", f"engine.continuation_decode_max={short_max}"))

    rows, masked = model(128), model(0)
    cost = {
        name: m.forward(s, graph=False, carry_over=False).attention_us
        for name, m, s in (("rows", rows, step), ("masked", masked, step), ("alone", rows, alone))
    }
    assert cost["alone"] < cost["rows"] < cost["masked"]
    gpu = rows.gpu
    extra = gpu.prefix_kernels_per_layer * rows.layers + gpu.prefix_kernels_extra
    assert masked.step_kernels(step, False) - rows.step_kernels(step, False) == extra
    assert rows.decode_table(step, None)[0] == 24


def test_the_decode_rows_bound_holds_for_several_short_continuations():
    """Three requests each a 5-token continuation and one decode row: 16 rows of 16 tokens."""
    q, ctx = np.array([5, 5, 5, 1]), np.array([50, 60, 70, 80])
    g = attention_groups(q, ctx - q, ctx, 8)
    assert g.decode_rows == 16 <= max_decode_rows(4, int(q.sum()), 8)
    assert max_decode_rows(4, 16, 0) == 4  # without short continuations, a row per request
    assert max_decode_rows(64, 2048, 128) == 64 + 2048  # no more than a step's tokens
