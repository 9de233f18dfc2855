"""A function over a validation's items in forked worker processes: each worker starts as a copy
of this process (the recordings read, their configs made), so only an item's index goes out and
its result comes back. The collector leaves what the workers inherit alone (heap.py)."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from cbsim.calibration.progress import progress
from cbsim.validation.heap import long_lived

# the function and items a forked worker maps (set before the pool forks)
_TASK: tuple[Callable[[Any], Any], Sequence[Any]] | None = None


def _call(i: int) -> Any:
    fn, items = _TASK
    return fn(items[i])


def forked_map(
    fn: Callable[[Any], Any], items: Sequence[Any], jobs: int, what: str = "", show: bool = False
) -> list[Any]:
    """``[fn(x) for x in items]`` in ``jobs`` forked worker processes (0: one per CPU; 1: here),
    in order, with a progress bar when ``show``."""
    jobs = min(jobs if jobs > 0 else (os.cpu_count() or 1), len(items))
    with long_lived():
        if jobs <= 1 or "fork" not in multiprocessing.get_all_start_methods():
            return [fn(x) for x in progress(items, len(items), what, show)]
        return _in_workers(fn, items, jobs, what, show)


def _in_workers(
    fn: Callable[[Any], Any], items: Sequence[Any], jobs: int, what: str, show: bool
) -> list[Any]:
    global _TASK
    _TASK = (fn, items)
    try:
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
            return list(progress(pool.map(_call, range(len(items))), len(items), what, show))
    finally:
        _TASK = None
