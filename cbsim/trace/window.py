"""A few windows of a run's spans, kept while the run is folded chunk by chunk: what the report
of a simulation without a trace draws as its timeline, in memory that does not grow with the
steps (cbsim.sim.recorder keeps one when the report is on and the trace is not).

Three windows of ``width`` steps, as the report of a whole trace picks its detail windows
(cbsim.report.frames.detail_windows): the first steps, a steady-state window and the end; a run
of at most 3 x ``width`` steps is kept whole. A window runs from the end of the step before it to
the end of its last step (the first from the run's start, the end to the last span's end) and
holds every span that overlaps it. The end window is the tail of the spans, cut as the steps
come. The steady window is picked as the chunks come: each chunk offers its calmest window
(``steady_start`` over the chunk's steps), kept when it starts GROWTH times past the last one
kept; candidates that the run's middle has passed are dropped but the last of them, so about
log(2) / log(GROWTH) + 2 wait at any time, and at the end the one nearest the middle is drawn (a
run folded at once gets the very window of its trace's report). The first HAZARDS_KEPT hazards
are kept whole (the report's table shows as many; their count is the fold's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from cbsim.trace import schema as S

GPU_LANES = (S.COMPUTE, S.DEFAULT)
# a window's steps when nothing else is asked (the report's detail windows; output's
# report_window_steps)
WINDOW_STEPS = 6
# a new steady-window candidate starts at least this factor past the last one kept
GROWTH = 1.25
HAZARDS_KEPT = 20


def steady_start(steps: pd.DataFrame, width: int = WINDOW_STEPS) -> int:
    """The first step of a window of typical steps: among the windows of the middle half, those
    whose steps stray least from the median step time (a periodic stall or a prefill strays),
    the one nearest the middle."""
    n = len(steps)
    mid = n // 2 - width // 2
    lo, hi = max(n // 4, width), min(3 * n // 4, n - 2 * width)
    if hi <= lo:
        return mid
    ms = steps["step_ms"].to_numpy(float)
    median = float(np.median(ms[lo : hi + width]))
    stray = np.abs(ms - median)
    worst = np.lib.stride_tricks.sliding_window_view(stray[lo : hi + width], width).max(axis=1)
    starts = np.arange(lo, lo + len(worst))
    # within a tenth of a step of the calmest window counts as calm: then nearest the middle
    calm = starts[worst <= worst.min() + 0.1 * median]
    return int(calm[np.argmin(np.abs(calm - mid))])


@dataclass
class Window:
    """One kept window: its label, its time (us; t0 None: from the run's start; t1 None: to the
    last span's end), its first step's place in the run and its spans."""

    label: str
    t0: float | None
    t1: float | None
    pos: int
    spans: pd.DataFrame


def overlapping(spans: pd.DataFrame, t0: float | None, t1: float | None) -> pd.DataFrame:
    """The spans that overlap [t0, t1] (as the report's detail windows filter them)."""
    keep = np.ones(len(spans), dtype=bool)
    if t0 is not None:
        keep &= spans["end"].to_numpy() >= t0
    if t1 is not None:
        keep &= spans["ts"].to_numpy() <= t1
    return spans[keep]


def step_ends(spans: pd.DataFrame) -> pd.Series:
    """Per step (index) its forwards' last end on a GPU lane."""
    fwd = spans[spans["lane"].isin(GPU_LANES) & spans["name"].isin(S.FORWARD_NAMES)]
    return fwd.groupby("step")["end"].max()


class StepWindows:
    """The windows of a run folded chunk by chunk (see the module docstring)."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.steps = 0  # steps seen
        self.ends = pd.Series(dtype=float)  # the last width + 1 steps' ends, by step
        self.first: list[pd.DataFrame] = []  # spans of the first window (all until its end)
        self.first_step: int | None = None  # the run's first step
        self.first_end: tuple[int, float] | None = None  # its last step and that step's end
        self.first_done = False
        self.whole: list[pd.DataFrame] | None = []  # every span while the run is short
        self.tail: pd.DataFrame | None = None  # spans that end in the last width steps or later
        self.candidates: list[Window] = []
        self.hazards: list[dict[str, Any]] = []
        self.windows: list[Window] = []  # once finished

    def hazard(self, **row: Any) -> None:
        if len(self.hazards) < HAZARDS_KEPT:
            self.hazards.append(row)

    def add(self, spans: pd.DataFrame, until: float | None) -> None:
        """A chunk of spans (in time order after the ones before): every span still to come
        starts at or after ``until`` (None: none is to come)."""
        if not len(spans):
            return
        pool = spans if self.tail is None else pd.concat((self.tail, spans), ignore_index=True)
        known = len(self.ends)
        ends = pd.concat((self.ends, step_ends(spans))).groupby(level=0).max().sort_values()
        first_pos = self.steps - known  # the place in the run of ends' first step
        self.steps += len(ends) - known
        if self.first_step is None and len(ends):
            self.first_step = int(ends.index[0])
        self._first(spans, ends, until)
        if self.whole is not None:
            self.whole.append(spans)
            if self.steps > 3 * self.width:
                self.whole = None
        self._candidate(pool, ends, first_pos, until)
        self.ends = ends.iloc[-(self.width + 1) :]
        cut = float(self.ends.iloc[0]) if self.steps > self.width else -np.inf
        self.tail = pool[pool["end"].to_numpy() >= cut]

    def _first(self, spans: pd.DataFrame, ends: pd.Series, until: float | None) -> None:
        """The first window's spans: every span until its last step's end is known for good."""
        if self.first_done:
            return
        if self.first_end is None and self.steps >= self.width:
            step = ends.index[self.width - 1]
            self.first_end = (int(step), float(ends.iloc[self.width - 1]))
        elif self.first_end is not None and self.first_end[0] in ends.index:
            self.first_end = (self.first_end[0], float(ends[self.first_end[0]]))
        t1 = self.first_end[1] if self.first_end is not None else None
        self.first = [overlapping(f, None, t1) for f in (*self.first, spans)]
        self.first_done = t1 is not None and (until is None or t1 <= until)

    def _candidate(
        self, pool: pd.DataFrame, ends: pd.Series, first_pos: int, until: float | None
    ) -> None:
        """This chunk's calmest window of complete steps, kept when far enough past the last."""
        w = self.width
        done = ends if until is None else ends[ends.to_numpy() <= until]
        if len(done) <= 3 * w:
            return
        # the first step's time is not known here (nor read: steady_start looks past it)
        table = pd.DataFrame({"step_ms": np.diff(done.to_numpy(), prepend=np.nan) / 1e3})
        i = max(1, steady_start(table, w))
        pos = first_pos + i
        if self.candidates and pos < GROWTH * self.candidates[-1].pos:
            return
        t0, t1 = float(done.iloc[i - 1]), float(done.iloc[i + w - 1])
        label = f"steady state: steps {done.index[i]}-{done.index[i + w - 1]}"
        self.candidates.append(Window(label, t0, t1, pos, overlapping(pool, t0, t1)))
        middle = self.steps / 2
        while len(self.candidates) > 1 and self.candidates[1].pos + w / 2 <= middle:
            self.candidates.pop(0)

    def finish(self) -> list[Window]:
        """The windows to draw, once the last chunk was added."""
        w, n = self.width, self.steps
        if self.whole is not None or n <= 3 * w:
            spans = pd.concat(self.whole or self.first or [_empty()], ignore_index=True)
            self.windows = [Window("whole run", None, None, 0, spans)]
            return self.windows
        numbers = self.ends.index
        first = self.first_end[0] if self.first_end else numbers[0]
        head = Window(
            f"first steps: steps {self.first_step}-{first}",
            None,
            self.first_end[1] if self.first_end else None,
            0,
            pd.concat(self.first, ignore_index=True),
        )
        middle = n / 2
        steady = min(self.candidates, key=lambda c: abs(c.pos + w / 2 - middle), default=None)
        end_spans = self.tail if self.tail is not None else _empty()
        end = Window(
            f"end: steps {numbers[1]}-{numbers[-1]}",
            float(self.ends.iloc[0]),
            None,
            n - w,
            end_spans,
        )
        self.windows = [head, *([steady] if steady is not None else []), end]
        self.first, self.candidates, self.tail = [], [], None
        return self.windows


def _empty() -> pd.DataFrame:
    return pd.DataFrame({k: [] for k in ("lane", "name", "ts", "dur", "end", "step")})
