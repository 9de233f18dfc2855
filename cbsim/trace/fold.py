"""A trace folded into what its metrics read, one time-ordered chunk of spans at a time.

cbsim.metrics computes every number from a TraceFold: a trace's span and instant tables folded
at once (cbsim.metrics.inputs_from_trace), or a simulation that keeps no trace, folded as it
runs (cbsim.sim.recorder). Either way the fold holds a few sums per lane and host phase, per
step the numbers percentiles and medians need (a forward's step, end and tokens; each host
phase's duration), per request one row of a table, and never a span: a run without a trace
keeps no more than that, however many steps it has.

Per step the fold also keeps the GPU lane's busy time up to the step's last forward end and its
batch kind (code in BATCH_KINDS), so a report without a trace draws its per-step charts.

Chunks come in time order: every span of a later chunk starts at or after every span of an
earlier one (a simulation folds the spans that start before its clock, whatever it writes next
starts later). Busy blocks, GPU idle gaps and steps that straddle two chunks are joined exactly;
sums run in another order than over one table, so the numbers agree to rounding (1e-12).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from cbsim.trace import schema as S

# the longest rest between two queued GPU spans still read as the cost of starting the second
# (an event wait and a graph launch reaching the GPU take 5-30 us on Hopper): longer is "other"
KERNEL_WAIT_MAX_US = 50.0
IDLE_PARTS = ("host_wait", "kernel_wait", "other")
# the lanes a run's GPU lane is one of (cbsim.metrics: compute, or default when only it ran)
GPU_LANES = (S.COMPUTE, S.DEFAULT)
# host-phase durations and request rows wait in this many pieces before they are joined
PIECES = 64
# a step's batch kind as a small code (per_step's ``kind``): its index here, -1 when unknown
KIND_CODES = {kind: i for i, kind in enumerate(S.BATCH_KINDS)}
# a GPU lane's forwards per step, within a chunk and across chunks' pieces
STEP_JOIN = {"end": "max", "tokens": "sum", "busy": "max", "kind": "max"}


def in_time_order(spans: pd.DataFrame) -> pd.DataFrame:
    """Rows by (ts, dur): float sums then run in one order whichever way the table was built
    (rows that tie on both add the same numbers whatever their order)."""
    order = np.lexsort((spans["dur"].to_numpy(), spans["ts"].to_numpy()))
    if len(order) < 2 or (order[1:] > order[:-1]).all():
        return spans
    return spans.iloc[order].reset_index(drop=True)


def request_rows(inst: pd.DataFrame) -> pd.DataFrame:
    """Per request (index rid): arrival, first_token, finish (us, NaN when it did not happen),
    tokens (from its finish instant) and prompt_len (from its arrival; NaN when not recorded)."""
    req = inst[(inst.lane == S.REQUESTS) & inst.rid.notna()]
    cols = {}
    for name in (S.ARRIVAL, S.FIRST_TOKEN, S.FINISH):
        cols[name] = req[req.name == name].groupby("rid")["ts"].min()
    fin = req[req.name == S.FINISH]
    cols["tokens"] = fin.groupby("rid")["tokens"].first()
    cols["prompt_len"] = (
        req[req.name == S.ARRIVAL].groupby("rid")["prompt_len"].first()
        if "prompt_len" in req.columns
        else pd.Series(dtype=float)
    )
    return pd.DataFrame(cols)


# how the rows of one request in several chunks join: its first event of each kind, the
# tokens and prompt length it was first recorded with
REQUEST_JOIN = {S.ARRIVAL: "min", S.FIRST_TOKEN: "min", S.FINISH: "min"}
REQUEST_JOIN |= {"tokens": "first", "prompt_len": "first"}


def busy_blocks(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals in start order, as disjoint blocks (starts, ends)."""
    running = np.maximum.accumulate(end)
    new = np.empty(len(ts), dtype=bool)
    new[0] = True
    new[1:] = ts[1:] > running[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(ts) - 1)
    return ts[first], running[last]


def busy_before(blocks_s: np.ndarray, blocks_e: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Busy time of disjoint sorted blocks up to each time in t."""
    if len(blocks_s) == 0:
        return np.zeros(len(t))
    cum = np.concatenate([[0.0], np.cumsum(blocks_e - blocks_s)])
    i = np.searchsorted(blocks_s, t, side="right")  # blocks starting at or before t
    partial = np.where(
        i > 0, np.minimum(t, blocks_e[np.maximum(i - 1, 0)]) - blocks_s[np.maximum(i - 1, 0)], 0.0
    )
    return cum[np.maximum(i - 1, 0)] * (i > 0) + np.maximum(partial, 0.0)


@dataclass
class Lane:
    """One lane's spans: how many, the union of their times, eager forwards' launch waits."""

    spans: int = 0
    closed_us: float = 0.0  # busy blocks that ended before the last chunk's
    block: tuple[float, float] | None = None  # the busy block the next chunk may extend
    launch_bound_us: float = 0.0
    # the last chunk's busy blocks and the busy time closed before them (busy_upto)
    chunk: tuple[float, np.ndarray, np.ndarray] = (0.0, np.empty(0), np.empty(0))

    def add(self, ts: np.ndarray, end: np.ndarray, launch_bound: np.ndarray) -> None:
        self.spans += len(ts)
        self.launch_bound_us += float(launch_bound.sum())
        if self.block is not None:
            ts, end = np.append(self.block[0], ts), np.append(self.block[1], end)
        starts, ends = busy_blocks(ts, end)
        self.chunk = (self.closed_us, starts, ends)
        self.closed_us += float((ends[:-1] - starts[:-1]).sum())
        self.block = (float(starts[-1]), float(ends[-1]))

    def busy_upto(self, t: np.ndarray) -> np.ndarray:
        """The lane's busy time from its start up to each time in t (times of the last chunk:
        what a later chunk adds starts after them on a lane whose spans do not overlap)."""
        closed, starts, ends = self.chunk
        return closed + busy_before(starts, ends, t)

    @property
    def busy_us(self) -> float:
        return self.closed_us + (self.block[1] - self.block[0] if self.block else 0.0)


@dataclass
class Forwards:
    """A GPU lane's forwards: sums, and per step its last end, its new tokens, the lane's busy
    time up to that end and its batch kind."""

    count: int = 0
    dur_us: float = 0.0
    tokens: int = 0
    # forwards that took time: their number, KV tokens and time (the HBM bandwidth)
    timed: int = 0
    timed_kv_tokens: int = 0
    timed_us: float = 0.0
    last_step: int = -1
    pieces: list[pd.DataFrame] = field(default_factory=list)  # step -> end, tokens, busy, kind

    def add(self, fwd: pd.DataFrame, busy: np.ndarray) -> None:
        """Fold a chunk's forwards; ``busy``: the lane's busy time up to each one's end."""
        dur = fwd["dur"].to_numpy()
        self.count += len(fwd)
        self.dur_us += float(dur.sum())
        self.tokens += int(fwd["new_tokens"].sum())
        ok = dur > 0
        self.timed += int(ok.sum())
        self.timed_kv_tokens += int(fwd["kv_tokens"].to_numpy()[ok].sum())
        self.timed_us += float(dur[ok].sum())
        self.last_step = max(self.last_step, int(fwd["step"].max()))
        kind = fwd["kind"].map(KIND_CODES).fillna(-1).to_numpy(dtype=np.int8)
        rows = pd.DataFrame(
            {"step": fwd["step"].to_numpy(), "end": fwd["end"].to_numpy(), "busy": busy}
        )
        rows = rows.assign(tokens=fwd["new_tokens"].to_numpy(), kind=kind)
        self._piece(rows.groupby("step").agg(STEP_JOIN))

    def settle(self, step: int, delta: int) -> None:
        """A forward's new tokens changed after it was folded (its update dropped some)."""
        self.tokens += delta
        row = {"end": [-np.inf], "tokens": [delta], "busy": [-np.inf], "kind": [np.int8(-1)]}
        self._piece(pd.DataFrame(row, index=[step]))

    def _piece(self, piece: pd.DataFrame) -> None:
        self.pieces.append(piece)
        if len(self.pieces) > PIECES:
            self.pieces = [self.per_step()]

    def per_step(self) -> pd.DataFrame:
        """Index step: the step's last forward end, its new tokens, the lane's busy time up to
        that end and its batch kind (KIND_CODES), steps by step."""
        if not self.pieces:
            return pd.DataFrame({"end": [], "tokens": [], "busy": [], "kind": []})
        if len(self.pieces) > 1:
            self.pieces = [pd.concat(self.pieces).groupby(level=0).agg(STEP_JOIN)]
        return self.pieces[0]


@dataclass
class Idle:
    """A GPU lane's idle time split as cbsim.metrics.idle says, up to its last span's end."""

    running_end: float | None = None  # the end of everything the lane ran so far
    parts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(IDLE_PARTS, 0.0))


class TraceFold:
    """What metrics read of a trace, folded chunk by chunk (see the module docstring)."""

    def __init__(self) -> None:
        self.span_range = (np.inf, -np.inf)  # first start, last end of the spans
        self.instant_range = (np.inf, -np.inf)
        self.lanes: dict[str, Lane] = {}
        self.host_us: Counter[str] = Counter()  # host time per phase
        self.host_spans: Counter[str] = Counter()
        # durations of the host phases but wait, per (phase, batch kind): the stalls' medians
        self.host_work: dict[tuple[str, str], list[np.ndarray]] = {}
        self.forwards = {lane: Forwards() for lane in GPU_LANES}
        self.idle = {lane: Idle() for lane in GPU_LANES}
        # the end of each step's host launch (its GPU work is queued from then on), for steps
        # whose GPU spans may still come; host work spans a later GPU idle gap may cover
        self.launch_end: dict[int, float] = {}
        self.host_tail = (np.empty(0), np.empty(0))
        self.hazards: Counter[str] = Counter()
        self.request_pieces: list[pd.DataFrame] = []

    @classmethod
    def of(cls, spans: pd.DataFrame, instants: pd.DataFrame) -> TraceFold:
        """The fold of whole tables (columns as cbsim.metrics.inputs says, ``end`` included)."""
        fold = cls()
        fold.add(spans, instants)
        return fold

    # ---- folding ---------------------------------------------------------------------------
    def add(self, spans: pd.DataFrame, instants: pd.DataFrame | None = None) -> None:
        """Fold a chunk: instants first (their times bound the run's start), then spans."""
        if instants is not None and len(instants):
            self._add_instants(instants)
        if not len(spans):
            return
        spans = in_time_order(spans)
        ts, end = spans["ts"].to_numpy(), spans["end"].to_numpy()
        lo, hi = self.span_range
        self.span_range = (min(lo, float(ts.min())), max(hi, float(end.max())))
        lane_col = spans["lane"].to_numpy()
        for name in pd.unique(lane_col):
            rows = lane_col == name
            self.lanes.setdefault(str(name), Lane()).add(
                ts[rows], end[rows], spans["launch_bound_us"].to_numpy()[rows]
            )
        host = spans[lane_col == S.HOST]
        self._add_host(host)
        for lane in GPU_LANES:
            on_lane = spans[lane_col == lane]
            if len(on_lane):
                fwd = on_lane[on_lane.name.isin(S.FORWARD_NAMES)]
                if len(fwd):
                    busy = self.lanes[lane].busy_upto(fwd["end"].to_numpy())
                    self.forwards[lane].add(fwd, busy)
                self._add_idle(lane, on_lane)
        self._prune()

    def _add_host(self, host: pd.DataFrame) -> None:
        if not len(host):
            return
        by_name = host.groupby("name")["dur"]
        self.host_us.update({str(k): float(v) for k, v in by_name.sum().items()})
        self.host_spans.update({str(k): int(v) for k, v in by_name.size().items()})
        work = host[host.name != S.WAIT]
        for (name, kind), dur in work.groupby(["name", "kind"])["dur"]:
            pieces = self.host_work.setdefault((str(name), str(kind)), [])
            pieces.append(dur.to_numpy(dtype=np.float64))
            if len(pieces) > PIECES:
                pieces[:] = [np.concatenate(pieces)]
        launch = host[(host.name == S.LAUNCH) & (host.step >= 0)]
        for step, e in launch.groupby("step")["end"].max().items():
            self.launch_end[int(step)] = max(float(e), self.launch_end.get(int(step), -np.inf))
        tail_ts, tail_end = self.host_tail
        self.host_tail = (
            np.concatenate((tail_ts, work["ts"].to_numpy())),
            np.concatenate((tail_end, work["end"].to_numpy())),
        )

    def _add_idle(self, lane: str, spans: pd.DataFrame) -> None:
        """Each idle stretch of the lane, up to its last span, split into IDLE_PARTS."""
        idle = self.idle[lane]
        start = idle.running_end if idle.running_end is not None else self.start
        ts, end = spans["ts"].to_numpy(), spans["end"].to_numpy()
        running = np.maximum.accumulate(np.append(start, end))
        idle.running_end = float(running[-1])
        before = running[:-1]
        gap = ts > before
        if not gap.any():
            return
        frm, to, step = before[gap], ts[gap], spans["step"].to_numpy()[gap]
        queued = np.array([self.launch_end.get(int(s), np.nan) for s in step])
        known = np.isfinite(queued)
        host = np.where(known, np.minimum(np.maximum(queued - frm, 0.0), to - frm), 0.0)
        # no launch span of that step (an import of another engine): the host's working time
        for i in np.flatnonzero(~known):
            host[i] = self._host_busy(frm[i], to[i])
        rest = (to - frm) - host
        parts = idle.parts
        parts["host_wait"] += float(host.sum())
        parts["kernel_wait"] += float(rest[(rest > 0) & (rest <= KERNEL_WAIT_MAX_US)].sum())
        parts["other"] += float(rest[rest > KERNEL_WAIT_MAX_US].sum())

    def _host_busy(self, a: float, b: float) -> float:
        """The host's working time (spans but ``wait``) inside [a, b)."""
        ts, ends = self.host_tail  # in time order, as the chunks come
        lo, hi = np.searchsorted(ends, a, side="right"), np.searchsorted(ts, b, side="left")
        if hi <= lo:
            return 0.0
        starts, stops = busy_blocks(np.clip(ts[lo:hi], a, b), np.clip(ends[lo:hi], a, b))
        return float((stops - starts).sum())

    def _prune(self) -> None:
        """Forget launches of steps the GPU lanes have passed and host spans that end before
        every GPU lane's last end: later idle gaps start after them."""
        ran = [lane for lane in GPU_LANES if self.idle[lane].running_end is not None]
        if not ran:
            return
        floor = min(self.forwards[lane].last_step for lane in ran)
        self.launch_end = {s: e for s, e in self.launch_end.items() if s >= floor}
        since = min(self.idle[lane].running_end for lane in ran)
        ts, end = self.host_tail
        keep = end > since
        self.host_tail = (ts[keep], end[keep])

    def _add_instants(self, inst: pd.DataFrame) -> None:
        times = inst["ts"].to_numpy(dtype=np.float64)
        lo, hi = self.instant_range
        self.instant_range = (min(lo, float(times.min())), max(hi, float(times.max())))
        hazards = inst[inst.name == S.HAZARD]
        if len(hazards):
            self.hazards.update(str(k) for k in hazards["kind"])
        rows = request_rows(inst)
        if len(rows):
            self.request_pieces.append(rows)
            if len(self.request_pieces) > PIECES:
                self.request_pieces = [self.requests()]

    def settle(self, lane: str, step: int, delta: int) -> None:
        """A forward already written produced ``delta`` more new tokens than it said."""
        self.forwards[lane].settle(step, delta)

    # ---- what metrics read -----------------------------------------------------------------
    @property
    def spans(self) -> int:
        return sum(lane.spans for lane in self.lanes.values())

    @property
    def start(self) -> float:
        return self.time_range()[0]

    def time_range(self) -> tuple[float, float]:
        """From the first event's start to the last event's end (spans and instants; 0 is the
        start of a run without spans)."""
        lo, hi = self.span_range if self.spans else (0.0, 0.0)
        ilo, ihi = self.instant_range
        return float(min(lo, ilo)), float(max(hi, ihi))

    def gpu_lane(self) -> str:
        """The compute stream; the legacy default stream when everything ran there."""
        spans = {lane: self.lanes[lane].spans if lane in self.lanes else 0 for lane in GPU_LANES}
        return S.DEFAULT if not spans[S.COMPUTE] and spans[S.DEFAULT] else S.COMPUTE

    def busy_us(self, lane: str) -> float:
        return self.lanes[lane].busy_us if lane in self.lanes else 0.0

    def host_work_us(self) -> dict[tuple[str, str], np.ndarray]:
        """Per (phase, batch kind) of the host's work (not ``wait``): every span's duration."""
        for pieces in self.host_work.values():
            if len(pieces) > 1:
                pieces[:] = [np.concatenate(pieces)]
        return {key: pieces[0] for key, pieces in self.host_work.items()}

    def idle_split(self, lane: str) -> dict[str, float] | None:
        """The lane's idle time per part of IDLE_PARTS (us; None when the lane ran nothing),
        the time after its last span as host wait (the host finishing up)."""
        idle = self.idle.get(lane)
        if idle is None or idle.running_end is None:
            return None
        parts = dict(idle.parts)
        end = self.time_range()[1]
        if end > idle.running_end:
            parts["host_wait"] += end - idle.running_end
        return parts

    def requests(self) -> pd.DataFrame:
        """request_rows of every chunk joined (one row per request)."""
        if not self.request_pieces:
            empty = ("lane", "name", "ts", "rid", "tokens", "prompt_len")
            return request_rows(pd.DataFrame({k: [] for k in empty}))
        if len(self.request_pieces) > 1:
            joined = pd.concat(self.request_pieces).groupby(level=0).agg(REQUEST_JOIN)
            self.request_pieces = [joined]
        return self.request_pieces[0]
