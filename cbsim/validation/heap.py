"""The cyclic garbage collector around data that lives as long as a task: the recordings a
validation or calibration loads (millions of small dicts) and the traces it simulates. Each full
collection walks all of them and frees none, and a forked worker that walks them also copies
every page they are on; frozen, the collector leaves them out."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """No collection inside the block (it builds long-lived objects and frees none)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextmanager
def long_lived() -> Iterator[None]:
    """The objects alive now, left out of every collection until the outermost such block ends
    (an inner block freezes what was made since; the outer one thaws them all)."""
    outermost = gc.get_freeze_count() == 0
    gc.freeze()
    try:
        yield
    finally:
        if outermost:
            gc.unfreeze()
