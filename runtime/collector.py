"""The engine owns Python's garbage collector, as serving engines do (vLLM's `freeze_gc_heap`).

A full collection scans every tracked object: with a model built (about 466k objects) it takes
100-270 ms, and one landing inside a timed run stalls the host for that long. Before the loop
everything alive is collected once and frozen (moved to a generation no collection scans), and
the collector is off while the loop runs; both are undone afterwards, so later work (building
the trace, the next run) collects as usual.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_frozen(counts: dict[str, int]) -> Iterator[None]:
    """Collect + freeze, collector off inside; `counts` gets the collections that still ran
    inside (0 unless someone called gc.collect) and the tracked objects the loop left behind."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    before = sum(s["collections"] for s in gc.get_stats())
    try:
        yield
    finally:
        counts["gc_collections_in_loop"] = sum(s["collections"] for s in gc.get_stats()) - before
        counts["gc_objects_left_by_loop"] = gc.get_count()[0]
        gc.unfreeze()
        if was_enabled:
            gc.enable()
