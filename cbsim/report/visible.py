"""What keeps a timeline honest at every zoom: waiting is not drawn as work, and short spans stay
visible.

- ``wait`` (the host blocked on the GPU) is drawn as a thin bar and counts as not busy in the
  binned overview, so at full view the host lane shows where the host works and where it only
  waits: the overlap async exists for.
- A span narrower than a few pixels (a 10 µs copy, a 23 µs launch in a 100 ms view) gets a tick
  mark of fixed pixel size at its middle, so it never vanishes; its bar keeps its true length.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from cbsim.report.style import color_of
from cbsim.trace import schema as S

NOT_BUSY = (S.WAIT,)  # phases drawn as waiting, not as work
BAR_WIDTH = 0.7  # of a row
WAIT_WIDTH = 0.2
# a span under this share of the visible window gets a tick (about 2 px of a 1,000 px plot)
SHORT_SHARE = 1 / 500
TICK_PX = 14


def bar_width(name: str) -> float:
    return WAIT_WIDTH if name in NOT_BUSY else BAR_WIDTH


def busy_spans(spans: pd.DataFrame) -> pd.DataFrame:
    """The spans that are work (``wait`` left out)."""
    return spans[~spans["name"].isin(NOT_BUSY)]


def add_short_ticks(
    fig: go.Figure,
    row: int,
    col: int,
    g: pd.DataFrame,
    y: np.ndarray,
    name: str,
    engine: str,
    window_ms: float,
    unit: float = 1.0,
) -> None:
    """A tick at the middle of each span of ``g`` shorter than SHORT_SHARE of ``window_ms``."""
    if name in NOT_BUSY or window_ms <= 0 or g.empty:
        return
    short = (g["end_ms"] - g["ts_ms"]).to_numpy(float) < window_ms * SHORT_SHARE
    if not short.any():
        return
    mid = ((g["ts_ms"] + g["end_ms"]).to_numpy(float) / 2)[short] / unit
    trace = go.Scattergl if short.sum() > 2000 else go.Scatter
    fig.add_trace(
        trace(
            x=mid,
            y=np.asarray(y)[short],
            mode="markers",
            marker=dict(symbol="line-ns", size=TICK_PX, line=dict(width=2, color=color_of(name))),
            customdata=g["dur_us"].to_numpy(float)[short],
            name=name,
            legendgroup=name,
            showlegend=False,
            meta="short",
            hovertemplate=f"<b>{name}</b> %{{customdata:.1f}} µs<extra>{engine}</extra>",
        ),
        row=row,
        col=col,
    )
