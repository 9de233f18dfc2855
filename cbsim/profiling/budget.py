"""The profile's time budget: each step says what it expects to take before it starts, prints one
progress line with the time left on stderr, and is skipped (and recorded as skipped) when it would
overrun the budget, so the command ends inside ``extra.max_minutes`` whatever the GPU."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass
class Budget:
    seconds: float
    t0: float = field(default_factory=time.monotonic)
    # step name -> {"status": done|skipped|failed, "seconds": ..., "note": ...}
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    # seconds the later steps are expected to take (the ETA adds them)
    ahead_s: float = 0.0

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def fits(self, expected_s: float) -> bool:
        return expected_s <= self.left()

    def say(self, line: str) -> None:
        print(f"profile_machine: {line}", file=sys.stderr, flush=True)

    def run(
        self, name: str, expected_s: float, body: Callable[[], T], reserve_s: float = 0.0
    ) -> T | None:
        """``body()``, or None when it would overrun the budget with ``reserve_s`` kept for the
        steps after it (recorded as skipped) or when it fails (recorded as failed, with the
        error's first line: a profile of the other steps is still written)."""
        self.ahead_s = max(0.0, self.ahead_s - expected_s)
        if not self.fits(expected_s + reserve_s):
            self.steps[name] = {
                "status": "skipped",
                "seconds": 0.0,
                "note": f"expected {expected_s:.0f} s (+ {reserve_s:.0f} s kept for later "
                f"steps), {max(self.left(), 0):.0f} s of the budget left (extra.max_minutes)",
            }
            self.say(
                f"{name}: skipped (expected {expected_s:.0f} s + {reserve_s:.0f} s kept, "
                f"{max(self.left(), 0):.0f} s left)"
            )
            return None
        eta = self.elapsed() + expected_s + self.ahead_s
        self.say(
            f"{name} (about {expected_s:.0f} s); {self.elapsed():.0f} s in, done in about "
            f"{_clock(eta)} of {_clock(self.seconds)}"
        )
        start = time.monotonic()
        try:
            out = body()
        except Exception as exc:  # one step's failure is recorded; the others still run
            note = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            self.steps[name] = {"status": "failed", "seconds": round(time.monotonic() - start, 2)}
            self.steps[name]["note"] = note
            self.say(f"{name}: failed ({note})")
            return None
        self.steps[name] = {"status": "done", "seconds": round(time.monotonic() - start, 2)}
        return out

    def skip(self, name: str, note: str) -> None:
        self.steps[name] = {"status": "skipped", "seconds": 0.0, "note": note}
        self.say(f"{name}: skipped ({note})")


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}:{seconds % 60:02d}"
