"""The events of a Kineto trace that the import (cbsim.trace.kineto) uses, kept in columns.

A torch.profiler trace of 10^7 events parsed whole is several GB of Python dicts; the import
needs a handful of fields of its host and GPU spans. Each element of ``traceEvents`` is handed to
``KinetoEvents.add`` as the stream reader (cbsim.trace.load.stream_object) decodes it, checked,
and reduced to one row of typed columns: category, name (an index into the distinct names),
ts, dur, thread or CUDA stream, correlation id and copy bytes: 33 bytes a host span, 45 a GPU
span, nothing for the rest (flow events, metadata). The helpers at the end count and add up on
columns in the order a loop over the events would, so every sum is a running total's to the
last bit, whichever way the events are held.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from cbsim.trace.checks import check_timed
from cbsim.trace.errors import TraceError

HOST_CATS = ("user_annotation", "cpu_op", "cuda_runtime", "cuda_driver")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# profiler spans that count as events of the trace (its start, the check that it has any) but
# are drawn nowhere
OTHER_CATS = ("gpu_user_annotation", "python_function")
KINETO_CATS = set(HOST_CATS) | set(GPU_CATS) | set(OTHER_CATS)
HOST, GPU, OTHER = 0, 1, 2
_TABLE = {
    **{c: (HOST, i) for i, c in enumerate(HOST_CATS)},
    **{c: (GPU, i) for i, c in enumerate(GPU_CATS)},
    **{c: (OTHER, 0) for c in OTHER_CATS},
}
RUNTIME = (HOST_CATS.index("cuda_runtime"), HOST_CATS.index("cuda_driver"))
KERNEL = GPU_CATS.index("kernel")
# an integer arg the event does not have; ODD_BYTES: a "bytes" arg that is no integer (kept
# aside as it is, written back unchanged)
ABSENT = -(2**63)
ODD_BYTES = ABSENT + 1
_INT_RANGE = range(ODD_BYTES + 1, 2**63)
_INF = math.inf


@dataclass
class Table:
    """Host or GPU spans, one row each: ``key`` is the thread (an index into
    ``KinetoEvents.threads``) of a host span, the CUDA stream of a GPU one; ``nbytes`` a GPU
    span's copy bytes, ``row`` its row in the table as read (file order: where
    ``KinetoEvents.odd_bytes`` has it), both None for the host."""

    cat: np.ndarray
    name: np.ndarray
    ts: np.ndarray
    dur: np.ndarray
    key: np.ndarray
    corr: np.ndarray
    nbytes: np.ndarray | None
    row: np.ndarray | None

    def keep(self, idx: np.ndarray) -> Table:
        """Keep the rows ``idx``, in that order, one column at a time (each column as read is
        let go once its copy is made: the peak is one column more, not a second table)."""
        for f in fields(self):
            if getattr(self, f.name) is not None:
                setattr(self, f.name, getattr(self, f.name)[idx])
        return self


class KinetoEvents:
    """The profiler spans of a trace, added one event at a time (``add``), as columns."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.threads: dict[tuple[Any, Any], int] = {}
        self.spans = 0  # profiler spans of every category
        self.t0 = math.inf  # the earliest start of any of them
        self.odd_bytes: dict[int, Any] = {}  # GPU row -> its "bytes" arg, where no integer
        self._cols: list[list[array]]
        self._append: list[tuple[Callable[[Any], None], ...]]  # the columns' append methods
        self._append_bytes: Callable[[int], None]
        self._reset()

    def _reset(self) -> None:
        self._cols = [_columns(t) for t in (HOST, GPU)]
        self._append = [tuple(c.append for c in cols[:6]) for cols in self._cols]
        self._append_bytes = self._cols[GPU][6].append

    def add(self, i: int, e: Any) -> None:
        """Check and keep element ``i`` of traceEvents (a span of another category, or no
        span, is passed over). The hot path of a large import: one call per event."""
        if not isinstance(e, dict):
            raise TraceError(f"event {i} is not an object")
        if e.get("ph") != "X":
            return
        try:
            table, code = _TABLE[e.get("cat")]
        except (KeyError, TypeError):  # another category, or one that is no string
            return
        ts, dur = e.get("ts"), e.get("dur")
        if not (type(ts) is float and type(dur) is float and -_INF < ts < _INF and 0 <= dur < _INF):
            ts, dur = _timed(e, i)
        name = e.get("name")
        if not isinstance(name, str):
            raise TraceError(f"event {i} has no name")
        self.spans += 1
        if ts < self.t0:
            self.t0 = ts
        if table == OTHER:
            return
        args = e.get("args")
        args = args if isinstance(args, dict) else {}
        nid = self.names.get(name)
        if nid is None:
            nid = self.names[name] = len(self.names)
        corr = _int_arg(args, "correlation", i, name)
        if table == HOST:
            key = self._thread(e, i)
        else:
            key = _int_arg(args, "stream", i, name)
            self._append_bytes(self._bytes(args))
        cat_, name_, ts_, dur_, key_, corr_ = self._append[table]
        cat_(code)
        name_(nid)
        ts_(ts)
        dur_(dur + 0.0)  # a duration of -0.0 adds as 0.0 does
        key_(key)
        corr_(corr)

    def _thread(self, e: dict[str, Any], i: int) -> int:
        key = (e.get("pid"), e.get("tid"))
        try:
            tid = self.threads.get(key)
        except TypeError:
            raise TraceError(f"event {i} has a pid or tid that is no number or string") from None
        if tid is None:
            tid = self.threads[key] = len(self.threads)
        return tid

    def _bytes(self, args: dict[str, Any]) -> int:
        if "bytes" not in args:
            return ABSENT
        v = args["bytes"]
        if type(v) is int and v in _INT_RANGE:
            return v
        self.odd_bytes[len(self._cols[GPU][0])] = v  # the row this span is about to get
        return ODD_BYTES

    def release(self) -> tuple[Table, Table]:
        """The host and GPU tables (numpy views of the columns, which this object gives up)."""
        host = Table(*(_numpy(c) for c in self._cols[HOST]), None, None)
        gpu = Table(*(_numpy(c) for c in self._cols[GPU]), None)
        gpu.row = np.arange(len(gpu.ts))
        self._reset()
        return host, gpu

    def name_list(self) -> list[str]:
        return list(self.names)

    def name_id(self, name: str) -> int:
        """The index of a name, added if no event has it (the import's own names)."""
        return self.names.setdefault(name, len(self.names))


def _columns(table: int) -> list[array]:
    """cat, name, ts, dur, key, corr (and a GPU span's bytes): the fields of ``Table``."""
    if table == HOST:
        return [array(t) for t in ("B", "i", "d", "d", "i", "q")]
    return [array(t) for t in ("B", "i", "d", "d", "q", "q", "q")]


def _numpy(col: array) -> np.ndarray:
    dtype = {"B": np.uint8, "i": np.intc, "d": np.float64, "q": np.int64}[col.typecode]
    return np.frombuffer(col, dtype) if len(col) else np.empty(0, dtype)


def _timed(e: dict[str, Any], i: int) -> tuple[float, float]:
    """The ts and dur of a span whose are not both finite floats (check_timed's checks)."""
    try:
        check_timed(e, i, "event")
        return float(e["ts"]), float(e["dur"])
    except OverflowError:
        raise TraceError(f"event {i} has a ts or dur too large to be a time") from None


def _int_arg(args: dict[str, Any], key: str, i: int, name: str) -> int:
    v = args.get(key)
    if v is None:
        return ABSENT
    if type(v) is not int or v not in _INT_RANGE:
        raise TraceError(f"event {i} ({name!r}) has args.{key} {v!r}, not an integer")
    return v


def name_table(names: list[str], test: Callable[[str], Any]) -> np.ndarray:
    """``test`` of every distinct name, indexable by a name column."""
    return np.fromiter((bool(test(n)) for n in names), dtype=bool, count=len(names))


def most_common(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values and their counts, most common first, ties in the order the values
    first appear (Counter(values).most_common())."""
    uniq, first, counts = np.unique(values, return_index=True, return_counts=True)
    order = np.lexsort((first, -counts))
    return uniq[order], counts[order]


def first_appearance(values: np.ndarray) -> np.ndarray:
    """The distinct values in the order they first appear."""
    uniq, first = np.unique(values, return_index=True)
    return uniq[np.argsort(first, kind="stable")]


def ordered_sums(keys: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, list[float], list[int]]:
    """Per distinct key, in the order keys first appear: the sum of its values added one at a
    time in their order (what ``total[key] += value`` in a loop gives, to the last bit), and
    how many there are."""
    if not len(keys):
        return keys, [], []
    order = np.argsort(keys, kind="stable")
    sk, sv = keys[order], vals[order]
    starts = np.concatenate(([0], np.flatnonzero(sk[1:] != sk[:-1]) + 1))
    ends = np.append(starts[1:], len(sk))
    rank = np.argsort(order[starts], kind="stable")
    sums = [float(np.cumsum(sv[a:b])[-1]) for a, b in zip(starts[rank], ends[rank])]
    return sk[starts[rank]], sums, (ends - starts)[rank].tolist()
