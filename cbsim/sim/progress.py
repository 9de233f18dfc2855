"""A progress bar for long simulations: generated tokens out of all the run will generate.

The SimPy loop is driven one event at a time, as ``Environment.run`` does itself, and the bar is
moved every few thousand events from the host's own token count: no event is added, so a run with
a bar is the same run (same trace, same counters). tqdm is optional (the sweep and test extras);
without it, or with ``output.progress`` off, the environment simply runs.
"""

from __future__ import annotations

import sys
from typing import Any

import simpy
from simpy.core import EmptySchedule

# events between two updates of the bar: a few ms of simulation, far below one redraw
EVENTS_PER_UPDATE = 4096
# a run shorter than this (seconds of wall time) shows no bar at all
SHOW_AFTER_S = 1.0


def run_with_progress(
    env: simpy.Environment, counts: dict[str, Any], total_tokens: int, what: str
) -> None:
    """``env.run()``, with a bar of ``counts["generated_tokens"]`` out of ``total_tokens``."""
    try:
        import tqdm
    except ImportError:
        env.run()
        return
    bar = tqdm.tqdm(total=total_tokens, desc=what, unit="tok", file=sys.stderr, delay=SHOW_AFTER_S)
    step = env.step
    try:
        while True:
            for _ in range(EVENTS_PER_UPDATE):
                step()
            bar.update(counts["generated_tokens"] - bar.n)
    except EmptySchedule:
        bar.update(counts["generated_tokens"] - bar.n)
    finally:
        bar.close()
