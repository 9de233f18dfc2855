"""Per-step tables of a recorded run: its forward spans with what ran with them, and the batch
shapes the cost model reads."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cbsim.trace import Trace
from cbsim.trace import schema as S


def span_table(trace: Trace) -> pd.DataFrame:
    """The trace's span table plus the args calibration reads: copy ``bytes``, ``carry_over_us``,
    and a Kineto import's per-forward ``kernels`` and ``kernel_busy_us``."""
    return trace.span_frame(
        {"bytes": None, "carry_over_us": None, "kernels": None, "kernel_busy_us": None}
    )


def with_replayed_batches(sp: pd.DataFrame, batches: list | None) -> pd.DataFrame:
    """A Kineto import's span table with each forward's batch args (requests, tokens, kind)
    from the scheduler replayed on the workload it is said to have run: the n-th forward (in
    time order) is the n-th batch. Forwards beyond the replay keep no batch (left out of the
    fit) and take the batch's step number."""
    sp = sp.copy()
    lane = gpu_lane(sp)
    fwd = sp[(sp.lane == lane) & sp.name.isin(S.FORWARD_NAMES)].sort_values("ts")
    sp["kind"] = sp["kind"].astype(object)
    for (idx, _), batch in zip(fwd.iterrows(), batches or []):
        sp.loc[idx, ["step", "requests", "query_tokens", "kv_tokens", "new_tokens"]] = [
            int(batch.step),
            len(batch),
            int(batch.query_tokens),
            int(batch.kv_tokens),
            int(batch.num_samples),
        ]
        sp.loc[idx, "kind"] = batch.kind
    return sp


def gpu_lane(spans: pd.DataFrame) -> str:
    has_compute = (spans.lane == S.COMPUTE).any()
    return S.COMPUTE if has_compute or not (spans.lane == S.DEFAULT).any() else S.DEFAULT


def forward_table(sp: pd.DataFrame, source: str, engine: str) -> pd.DataFrame:
    """Per forward span: its args, whether a carry-over ran with it (``carry``) and whether that
    was a span of its own (``carry_span``, else inside the replay: arg ``carry_over_us``)."""
    lane = gpu_lane(sp)
    fwd = sp[(sp.lane == lane) & sp.name.isin(S.FORWARD_NAMES)].copy()
    carry = set(sp[(sp.lane == lane) & (sp.name == S.CARRY_OVER)].step)
    fwd["graph"] = fwd.name == S.GRAPH_REPLAY
    fwd["carry_span"] = fwd.step.isin(carry)
    fwd["carry"] = fwd.carry_span | fwd.carry_over_us.notna()
    if source == "runtime" and engine == "async" and not fwd.carry.any():
        # the runtime's carry-over is captured in the graph and not marked: every decode step
        # after the first launch scatters the previous batch's tokens
        fwd["carry"] = (fwd.kind != "prefill") & (fwd.step > fwd.step.min())
    return fwd[fwd.requests > 0]


def samples_by_step(fwd: pd.DataFrame) -> pd.Series:
    """Sampled tokens per step, from a ``forward_table``."""
    return fwd.groupby("step")["new_tokens"].sum()


class StepShape:
    """What CostModel.forward reads from a scheduler Batch: the replayed batch's per-request
    lengths when known (``Recorded.batches``), else the span's totals shared evenly over the
    requests (exact for decode, an approximation for prefill)."""

    def __init__(
        self,
        requests: int,
        query_tokens: int,
        kv_tokens: int,
        samples: int,
        kind: str,
        lens: tuple[np.ndarray, np.ndarray] | None = None,
    ):
        self.n = requests
        self.query_tokens, self.kv_tokens, self.num_samples = query_tokens, kv_tokens, samples
        self.kind = kind
        if lens is not None:
            self.query_lens, self.context_lens = lens
        else:
            self.query_lens = _even(query_tokens, requests)
            self.context_lens = _even(kv_tokens, requests)
        # context = the cached prefix + this step's tokens
        self.start_pos = self.context_lens - self.query_lens

    def __len__(self) -> int:
        return self.n


def _even(total: int, n: int) -> np.ndarray:
    base = np.full(n, total // n, dtype=np.int64)
    base[: total - base.sum()] += 1
    return base


def step_shapes(
    fwd: pd.DataFrame, batches: dict[int, tuple[np.ndarray, np.ndarray]]
) -> list[StepShape]:
    """A StepShape per forward span row (``forward_table``), with the replayed per-request
    lengths where ``batches`` has the step."""
    return [
        StepShape(
            int(r.requests),
            int(r.query_tokens),
            int(r.kv_tokens),
            int(r.new_tokens),
            r.kind,
            batches.get(int(r.step)),
        )
        for r in fwd.itertuples()
    ]
