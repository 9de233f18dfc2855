"""What the simulator records of one run: every span, counter sample, request event and hazard.

With a trace asked for, the events go to a TraceBuilder through its hot-path writer
(``add_span``, ``host_span``, ``add_counter``: a ready args dict, one per step, shared by that
step's spans; the trace is read-only once built). Without one, the same calls fill the columns
metrics are computed from (cbsim.metrics.MetricInputs: span and instant tables, times rounded
to the nanosecond as a trace stores them), so the metrics are the trace's by construction.
runtime/recorder.py is the runtime's counterpart.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from cbsim.trace import TraceBuilder
from cbsim.trace import schema as S

SPAN_COLUMNS = ("step", "requests", "query_tokens", "kv_tokens", "kind", "new_tokens")
ARG_DEFAULTS = {"step": -1, "requests": 0, "query_tokens": 0, "kv_tokens": 0, "kind": ""}


class Recorder:
    """The run's trace writer (``builder`` given) or its metric columns (``builder`` None)."""

    def __init__(self, builder: TraceBuilder | None, lanes: tuple[str, ...]) -> None:
        self.builder = builder
        self.tracing = builder is not None
        if builder is not None:
            for lane in lanes:
                builder.declare_lane(lane)
            self.span = builder.add_span
            self.host_span = builder.host_span
            self.counter = builder.add_counter
            return
        self.lanes = list(dict.fromkeys((*S.REQUIRED_LANES, S.REQUESTS, *lanes)))
        # one entry per span recorded one at a time; the args dicts are read at the end (a
        # forward's new_tokens is settled when its batch is updated)
        self.cols: dict[str, list[Any]] = {k: [] for k in ("lane", "name", "ts", "dur", "args")}
        self.blocks: list[dict[str, Any]] = []  # many spans of one lane and name (extend)
        # extended forward spans' new_tokens, settled when their batch is updated: (column, row,
        # args)
        self.forward_args: list[tuple[Any, int, dict[str, Any]]] = []
        self.inst: dict[str, list[Any]] = {
            k: [] for k in ("lane", "name", "ts", "rid", "tokens", "prompt_len")
        }
        self.inst_kind: list[str] = []
        self.samples = 0  # counter samples a trace would hold
        self.span = self._span
        self.host_span = self._host_span
        self.counter = self._counter

    # ---- without a trace: columns ---------------------------------------------------------
    def _span(self, lane: str, name: str, ts: float, dur: float, args: dict[str, Any]) -> None:
        c = self.cols
        c["lane"].append(lane)
        c["name"].append(name)
        c["ts"].append(ts)
        c["dur"].append(dur)
        c["args"].append(args)

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

    def extend(
        self, lane: str, name: str, ts: list[float], dur: list[float], **args: Any
    ) -> dict[str, Any]:
        """Many spans of one lane and name at once (args: a column list or one value each)."""
        n = len(ts)
        block = {"n": n, "lane": lane, "name": name, "ts": ts, "dur": dur}
        for k in SPAN_COLUMNS:
            v = args.get(k, ARG_DEFAULTS.get(k, 0))
            block[k] = np.asarray(v, dtype=np.int64) if isinstance(v, list) else v
        if isinstance(block["new_tokens"], int):
            block["new_tokens"] = np.full(n, block["new_tokens"], dtype=np.int64)
        wait = args.get("launch_bound_us", 0.0)  # eager forwards: their wait on the launches
        block["launch_bound_us"] = (
            np.asarray(wait, dtype=np.float64) if isinstance(wait, list) else wait
        )
        self.blocks.append(block)
        return block

    def settle(self, block: dict[str, Any], args: dict[str, Any]) -> None:
        """The last span of ``block`` is a forward whose new_tokens its update may change."""
        self.forward_args.append((block["new_tokens"], block["n"] - 1, args))

    # ---- both ---------------------------------------------------------------------------------
    def request_event(self, name: str, ts: float, rid: int, **args: Any) -> None:
        if self.builder is not None:
            self.builder.request_event(name, ts, rid, **args)
        else:
            tokens, prompt = args.get("tokens", math.nan), args.get("prompt_len", math.nan)
            self._instant(S.REQUESTS, name, ts, rid, tokens, "", prompt)

    def hazard(self, lane: str, ts: float, kind: str, step: int, slot: int, detail: str) -> None:
        if self.builder is not None:
            self.builder.hazard(lane, ts, kind, step, slot, detail)
        else:
            self._instant(lane, S.HAZARD, ts, math.nan, math.nan, kind)

    @property
    def num_events(self) -> int:
        """Events in the trace (or that a trace would hold)."""
        if self.builder is not None:
            return len(self.builder.events)
        pids = {S.LANE_IDS[lane][0] for lane in self.lanes}
        spans = len(self.cols["ts"]) + sum(b["n"] for b in self.blocks)
        # a name and a sort index for each process and each lane
        return 2 * (len(pids) + len(self.lanes)) + spans + len(self.inst["ts"]) + self.samples

    def tables(self) -> dict[str, Any]:
        """The span and instant tables (cbsim.metrics.MetricInputs' spans, instants, lanes)."""
        c = dict(self.cols)
        arg_list = c.pop("args")
        for k, d in {**ARG_DEFAULTS, "new_tokens": 0, "launch_bound_us": 0.0}.items():
            c[k] = [a.get(k, d) for a in arg_list]
        for column, row, args in self.forward_args:
            column[row] = args["new_tokens"]
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
        spans = pd.DataFrame(
            {
                # compared often: categories are fast
                "lane": pd.Categorical.from_codes(lanes.astype(np.int64), self.lanes),
                "name": pd.array(col("name", object), dtype="str"),
                **span_columns(col("ts", np.float64), col("dur", np.float64)),
                **{k: col(k, np.int64) for k in SPAN_COLUMNS[:4]},
                "kind": pd.array(col("kind", object), dtype="str"),
                "new_tokens": col("new_tokens", np.int64),
                "launch_bound_us": col("launch_bound_us", np.float64),
            }
        )
        inst = dict(self.inst)
        if any(self.inst_kind):
            inst["kind"] = self.inst_kind
        rid = np.asarray(inst["rid"], dtype=np.float64)
        inst["rid"] = rid if np.isnan(rid).any() else rid.astype(np.int64)
        lanes_out = [x for x in self.lanes if x != S.REQUESTS]
        return {"spans": spans, "instants": pd.DataFrame(inst), "lanes": lanes_out}


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
