"""What the simulator records of one run: every span, counter sample, request event and hazard.

With a trace asked for, the events go to a TraceBuilder through its hot-path writer
(``add_span``, ``host_span``, ``add_counter``: a ready args dict, one per step, shared by that
step's spans; the trace is read-only once built). Without one, the same calls fill a buffer of
the columns metrics read (times rounded to the nanosecond as a trace stores them), folded into
a cbsim.trace.TraceFold every CHUNK_SPANS spans (``fold_before``: the spans that start before
the clock; nothing written later starts earlier), so the metrics are the trace's by
construction and the run's memory does not grow with its steps. Instants are folded by
themselves every CHUNK_SPANS of them too (the fold joins a request's rows whatever chunks they
came in), so a run of many requests holds a row a request, not its four instants. With
``window`` (the report on, the trace off) each folded chunk also goes to a
cbsim.trace.window.StepWindows, which keeps the spans of a few windows of steps for the report's
timeline. runtime/recorder.py is the runtime's counterpart.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from cbsim.trace import TraceBuilder
from cbsim.trace import schema as S
from cbsim.trace.fold import TraceFold
from cbsim.trace.window import StepWindows

SPAN_COLUMNS = ("step", "slot", "requests", "query_tokens", "kv_tokens", "kind", "new_tokens")
ARG_DEFAULTS = dict(step=-1, slot=-1, requests=0, query_tokens=0, kv_tokens=0, kind="")
INSTANT_COLUMNS = ("lane", "name", "ts", "rid", "tokens", "prompt_len")
# spans buffered before they are folded (about 300 bytes each while buffered)
CHUNK_SPANS = 1 << 15


class Recorder:
    """The run's trace writer (``builder`` given) or its fold (``builder`` None), and without a
    trace the windows of steps the report draws (``window``: their width in steps)."""

    def __init__(
        self,
        builder: TraceBuilder | None,
        lanes: tuple[str, ...],
        chunk: int = CHUNK_SPANS,
        window: int | None = None,
    ) -> None:
        self.builder = builder
        self.tracing = builder is not None
        self.window = StepWindows(window) if window and builder is None else None
        if builder is not None:
            for lane in lanes:
                builder.declare_lane(lane)
            self.span = builder.add_span
            self.host_span = builder.host_span
            self.counter = builder.add_counter
            self.fold_before = _nothing
            return
        self.lanes = list(dict.fromkeys((*S.REQUIRED_LANES, S.REQUESTS, *lanes)))
        self.fold = TraceFold()
        self.chunk = chunk
        self.held: pd.DataFrame | None = None  # folded spans' later neighbours, held back
        self.written = {"spans": 0, "instants": 0}
        self.samples = 0  # counter samples a trace would hold
        self._empty_buffer()
        self.span = self._span
        self.host_span = self._host_span
        self.counter = self._counter
        self.fold_before = self._fold_before

    def _empty_buffer(self) -> None:
        # one entry per span recorded one at a time; the args dicts are read when folded
        self.cols: dict[str, list[Any]] = {k: [] for k in ("lane", "name", "ts", "dur", "args")}
        self.blocks: list[dict[str, Any]] = []  # many spans of one lane and name (extend)
        self.buffered = 0
        self._empty_instants()

    def _empty_instants(self) -> None:
        self.inst: dict[str, list[Any]] = {k: [] for k in INSTANT_COLUMNS}
        self.inst_kind: list[str] = []

    # ---- without a trace: columns, folded ----------------------------------------------------
    def _span(self, lane: str, name: str, ts: float, dur: float, args: dict[str, Any]) -> None:
        c = self.cols
        c["lane"].append(lane)
        c["name"].append(name)
        c["ts"].append(ts)
        c["dur"].append(dur)
        c["args"].append(args)
        self.buffered += 1

    def _host_span(self, name: str, ts: float, dur: float, args: dict[str, Any]) -> None:
        self._span(S.HOST, name, ts, dur, args)

    def _counter(self, name: str, ts: float, values: dict[str, Any]) -> None:
        self.samples += 1

    def _instant(
        self,
        lane: str,
        name: str,
        ts: float,
        rid: float,
        tokens: float,
        kind: str,
        prompt_len: float = math.nan,
    ) -> None:
        i = self.inst
        i["lane"].append(lane)
        i["name"].append(name)
        i["ts"].append(round(float(ts), 3))
        i["rid"].append(rid)
        i["tokens"].append(tokens)
        i["prompt_len"].append(prompt_len)
        self.inst_kind.append(kind)
        if len(self.inst_kind) >= self.chunk:
            self.fold.add(_NO_SPANS, self._drain_instants())

    def extend(self, lane: str, name: str, ts: list[float], dur: list[float], **args: Any) -> None:
        """Many spans of one lane and name at once (args: a column list or one value each)."""
        n = len(ts)
        block = {"n": n, "lane": lane, "name": name, "ts": ts, "dur": dur}
        for k in SPAN_COLUMNS:
            v = args.get(k, ARG_DEFAULTS.get(k, 0))
            block[k] = np.asarray(v, dtype=np.int64) if isinstance(v, list) else v
        wait = args.get("launch_bound_us", 0.0)  # eager forwards: their wait on the launches
        block["launch_bound_us"] = (
            np.asarray(wait, dtype=np.float64) if isinstance(wait, list) else wait
        )
        self.blocks.append(block)
        self.buffered += n

    def _fold_before(self, now: float) -> None:
        """Fold the buffer once it holds a chunk: the spans that start before ``now`` (what is
        written later starts at ``now`` or after), the rest held for the next chunk."""
        if self.buffered >= self.chunk:
            self._fold(round(now, 3))

    def _fold(self, until: float | None) -> None:
        spans, instants = self._drain()
        if self.held is not None:
            spans = pd.concat((self.held, spans), ignore_index=True)
            self.held = None
        if until is not None:
            later = spans["ts"].to_numpy() >= until
            if later.any():
                self.held = spans[later].reset_index(drop=True)
                spans = spans[~later]
        self.fold.add(spans, instants)
        if self.window is not None:
            self.window.add(spans, until)

    # ---- both ---------------------------------------------------------------------------------
    def settle(self, lane: str, args: dict[str, Any], new_tokens: int) -> None:
        """A forward's new tokens, known once its batch is updated (tokens sampled after a
        request's EOS are dropped): ``args`` are the forward span's, written on ``lane``."""
        if self.builder is not None:
            args["new_tokens"] = new_tokens  # the trace's args dict, not yet written out
        elif new_tokens != args["new_tokens"]:
            self.fold.settle(lane, int(args["step"]), new_tokens - int(args["new_tokens"]))

    def request_event(self, name: str, ts: float, rid: int, **args: Any) -> None:
        if self.builder is not None:
            self.builder.request_event(name, ts, rid, **args)
        else:
            tokens, prompt = args.get("tokens", math.nan), args.get("prompt_len", math.nan)
            self._instant(S.REQUESTS, name, ts, rid, tokens, "", prompt)

    def hazard(self, lane: str, ts: float, kind: str, step: int, slot: int, detail: str) -> None:
        if self.builder is not None:
            self.builder.hazard(lane, ts, kind, step, slot, detail)
            return
        self._instant(lane, S.HAZARD, ts, math.nan, math.nan, kind)
        if self.window is not None:
            ts = round(float(ts), 3)
            self.window.hazard(ts=ts, lane=lane, kind=kind, step=step, slot=slot, detail=detail)

    @property
    def num_events(self) -> int:
        """Events in the trace (or that a trace would hold)."""
        if self.builder is not None:
            return len(self.builder.events)
        pids = {S.LANE_IDS[lane][0] for lane in self.lanes}
        spans = self.written["spans"] + self.buffered
        instants = self.written["instants"] + len(self.inst["ts"])
        # a name and a sort index for each process and each lane
        return 2 * (len(pids) + len(self.lanes)) + spans + instants + self.samples

    def tables(self) -> dict[str, Any]:
        """The run folded (cbsim.metrics.MetricInputs' fold and lanes); the windows finished."""
        self._fold(None)
        if self.window is not None:
            self.window.finish()
        lanes_out = [x for x in self.lanes if x != S.REQUESTS]
        return {"fold": self.fold, "lanes": lanes_out}

    def _drain(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The buffer as span and instant tables (the columns cbsim.metrics.inputs names),
        emptied."""
        c = dict(self.cols)
        arg_list = c.pop("args")
        for k, d in {**ARG_DEFAULTS, "new_tokens": 0, "launch_bound_us": 0.0}.items():
            c[k] = [a.get(k, d) for a in arg_list]
        code = {lane: i for i, lane in enumerate(self.lanes)}
        blocks = self.blocks
        counts = [b["n"] for b in blocks]

        def col(key: str, dtype: Any) -> np.ndarray:
            head = np.asarray(c[key], dtype=dtype)
            if not blocks:
                return head
            values = [b[key] for b in blocks]
            if all(np.isscalar(v) for v in values):  # one value a block: repeat them at once
                rest = np.repeat(np.asarray(values, dtype=dtype), counts)
                return np.concatenate((head, rest))
            parts = [
                np.full(n, v, dtype=dtype) if np.isscalar(v) else v for v, n in zip(values, counts)
            ]
            return np.concatenate([head, *(np.asarray(p, dtype=dtype) for p in parts)])

        lane_codes = np.asarray([code[x] for x in c["lane"]], dtype=np.int64)
        block_codes = np.repeat(
            np.asarray([code[b["lane"]] for b in blocks], dtype=np.int64), counts
        )
        lanes = np.concatenate((lane_codes, block_codes))
        times = span_columns(col("ts", np.float64), col("dur", np.float64))
        spans = pd.DataFrame(
            {
                # compared often: categories are fast
                "lane": pd.Categorical.from_codes(lanes.astype(np.int64), self.lanes),
                "name": pd.array(col("name", object), dtype="str"),
                **times,
                "end": times["ts"] + times["dur"],
                **{k: col(k, np.int64) for k in SPAN_COLUMNS[:5]},
                "kind": pd.array(col("kind", object), dtype="str"),
                "new_tokens": col("new_tokens", np.int64),
                "launch_bound_us": col("launch_bound_us", np.float64),
            }
        )
        self.written["spans"] += self.buffered
        instants = self._drain_instants()
        self._empty_buffer()
        return spans, instants

    def _drain_instants(self) -> pd.DataFrame:
        """The instant buffer as a table (cbsim.metrics.inputs' columns), emptied."""
        inst = dict(self.inst)
        inst["kind"] = self.inst_kind
        rid = np.asarray(inst["rid"], dtype=np.float64)
        inst["rid"] = rid if np.isnan(rid).any() else rid.astype(np.int64)
        self.written["instants"] += len(self.inst["ts"])
        self._empty_instants()
        return pd.DataFrame(inst)


# what an instants-only fold passes for its spans
_NO_SPANS = pd.DataFrame()


def _nothing(now: float) -> None:
    """fold_before of a run that keeps its trace."""


def span_columns(ts: np.ndarray, dur: np.ndarray) -> dict[str, np.ndarray]:
    """ts and dur as a trace writes them (cbsim.trace.builder.span_times): the rounded start,
    and the rounded end minus it."""
    start = round3(ts)
    return {"ts": start, "dur": round3(round3(ts + dur) - start)}


def round3(values: np.ndarray) -> np.ndarray:
    """``round(v, 3)`` of every value, as a trace stores times (Python's correctly rounded
    result: numpy's ``rint(v * 1000) / 1000`` agrees except within a few ulps of a tie, where
    Python decides)."""
    x = np.asarray(values, dtype=np.float64)
    y = x * 1000.0
    out = np.rint(y) / 1000.0
    near = np.abs(y - np.floor(y) - 0.5) <= 4 * np.spacing(np.abs(y))
    if near.any():
        idx = np.flatnonzero(near)
        out[idx] = [round(float(v), 3) for v in x[idx]]
    return out
