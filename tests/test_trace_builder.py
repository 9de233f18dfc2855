"""The one writer: keyword spans and the hot path write identical events; batch_args is the
span-args dict every writer uses."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cbsim.trace import NO_BATCH, TraceBuilder, batch_args
from cbsim.trace import schema as S


@dataclass
class FakeShape:
    """The fields of a scheduler Batch that span args read (numpy ints, as a Batch holds)."""

    step: int
    num_requests: int
    query_tokens: int
    kv_tokens: int
    kind: str


def test_batch_args_has_the_standard_keys_as_plain_python_values():
    b = FakeShape(np.int64(3), 4, np.int64(40), np.int64(1000), "mixed")
    args = batch_args(b, slot=1, new_tokens=4)
    assert list(args)[: len(S.SPAN_ARGS)] == list(S.SPAN_ARGS)
    assert args == {
        "step": 3,
        "slot": 1,
        "requests": 4,
        "query_tokens": 40,
        "kv_tokens": 1000,
        "kind": "mixed",
        "new_tokens": 4,
    }
    assert all(type(args[k]) is int for k in ("step", "slot", "query_tokens", "kv_tokens"))
    assert batch_args(None) == NO_BATCH and batch_args(None, slot=0)["slot"] == 0


def test_keyword_and_hot_path_write_identical_events():
    shape = FakeShape(7, 2, 2, 514, "decode")
    slow, fast = TraceBuilder("sim"), TraceBuilder("sim")
    for lane in (S.HOST, S.H2D, S.COMPUTE, S.D2H):
        fast.declare_lane(lane)
    args = batch_args(shape, slot=1)
    for ts in (0, 10.0004, 123456.78951):
        slow.span(S.HOST, S.PREPARE, ts, 5.5, **args)
        fast.host_span(S.PREPARE, ts, 5.5, args)
        slow.span(S.COMPUTE, S.GRAPH_REPLAY, ts + 1, 99.9999, **args, new_tokens=2)
        fast.add_span(S.COMPUTE, S.GRAPH_REPLAY, ts + 1, 99.9999, {**args, "new_tokens": 2})
        slow.span(S.H2D, S.COPY_H2D, ts, 1.0, **args, bytes=64)
        fast.add_span(S.H2D, S.COPY_H2D, ts, 1.0, {**args, "bytes": 64})
        slow.counter(S.SCHEDULER_COUNTER, ts, waiting=1, running=2, kv_blocks_used=3)
        fast.add_counter(S.SCHEDULER_COUNTER, ts, {"waiting": 1, "running": 2, "kv_blocks_used": 3})
    assert slow.events == fast.events
    assert slow.build().spans.equals(fast.build().spans)
