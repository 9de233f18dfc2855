"""Ctrl-C and SIGTERM end a run the same way: raised where the run is, as KeyboardInterrupt, so
the back ends keep the trace so far and the entry point exits 130 (SIGINT) or 143 (SIGTERM)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

_received: int | None = None


class Terminated(KeyboardInterrupt):
    """SIGTERM (a batch system's kill, `kill PID`), handled like Ctrl-C."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _received
    _received = signum
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def interrupts_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise inside the block (main thread only: signals arrive there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def signal_name() -> str:
    return signal.Signals(_received or signal.SIGINT).name


def exit_code() -> int:
    """128 + the signal, as a shell reports a process its signal ended."""
    return 128 + int(_received or signal.SIGINT)
