"""Per-step tables of a recorded run: its forward spans with what ran with them, and the batch
shapes the cost model reads."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cbsim.trace import Trace
from cbsim.trace import schema as S

# The runtime's loop works between the phases it times (the recorder's writes, the loop's own
# bookkeeping) after schedule, launch and update: 3-20 us each (median 3.3, p99 21 over
# the H200's recordings; 12-30 us a step), host time the simulator only charges inside phases. Longer gaps are the retirement of finished requests
# (70-500 us a finishing step; 2-18 ms when a whole batch finishes) or a sleep until an
# arrival: not per-step loop work.
LOOP_GAP_US = 50.0


def span_table(trace: Trace) -> pd.DataFrame:
    """The trace's span table plus the args calibration reads: copy ``bytes``, ``carry_over_us``,
    and a Kineto import's per-forward ``kernels`` and ``kernel_busy_us``; a runtime trace's
    host phases each run on over the loop's own work after it (``with_loop_work``)."""
    sp = trace.span_frame(
        {"bytes": None, "carry_over_us": None, "kernels": None, "kernel_busy_us": None}
    )
    return with_loop_work(sp, trace.instants) if trace.source == "runtime" else sp


def with_loop_work(sp: pd.DataFrame, instants: pd.DataFrame) -> pd.DataFrame:
    """Each host span extended to the next one's start where the gap between them is the
    loop's own work (up to ``LOOP_GAP_US``; not where the host may have slept for a request that
    arrived in the gap), so the phase costs fitted from them hold all of the host's time."""
    host = sp[sp.lane == S.HOST].sort_values("ts")
    nxt = host.ts.shift(-1).to_numpy()
    gap = nxt - host.end.to_numpy()
    arrivals = np.sort(instants.ts[instants.name == S.ARRIVAL].to_numpy()) if len(instants) else []
    arrived = np.searchsorted(arrivals, nxt) > np.searchsorted(arrivals, host.end.to_numpy())
    fold = (gap > 0) & (gap <= LOOP_GAP_US) & ~arrived
    sp = sp.copy()
    idx = host.index[fold]
    sp.loc[idx, "dur"] += gap[fold]
    sp.loc[idx, "end"] += gap[fold]
    return sp


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
