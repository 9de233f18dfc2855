"""A progress bar with an ETA for the long parts of a calibration or a validation (tqdm when installed, else one
log line per item), on stderr so the printed tables stay clean."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger("cbsim")

try:
    import tqdm as _tqdm

    # no monitor thread: fits run in forked worker processes
    _tqdm.tqdm.monitor_interval = 0
except ImportError:  # tqdm is in the sweep and test extras; without it, log lines
    _tqdm = None


def progress(items: Iterable[T], total: int, what: str, enabled: bool = True) -> Iterator[T]:
    """``items`` with a bar (``what``, done/total, elapsed and ETA)."""
    if not enabled:
        yield from items
        return
    if _tqdm is not None:
        yield from _tqdm.tqdm(items, total=total, desc=what, unit="", file=sys.stderr, leave=True)
        return
    start = time.monotonic()
    for i, item in enumerate(items, 1):
        yield item
        spent = time.monotonic() - start
        eta = spent / i * (total - i)
        log.info("%s %d/%d (%.0f s, about %.0f s left)", what, i, total, spent, eta)
