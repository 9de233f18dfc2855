"""The simulator's SimPy environment, with one addition: a timeout that lands on an absolute time.

SimPy moves its clock by ``now + delay``; a fast-forwarded stretch ends at the time stepping
would have reached phase by phase, which ``now + delay`` cannot always hit (the sum rounds).
``timeout_at`` schedules the wake-up at that very time, the way ``Environment.schedule`` does.
"""

from __future__ import annotations

from heapq import heappush

import simpy
from simpy.core import NORMAL


class Clock(simpy.Environment):
    def timeout_at(self, t: float) -> simpy.Event:
        """An event that fires at time ``t`` (not before now)."""
        if t < self.now:
            raise ValueError(f"timeout_at({t}) is before now ({self.now})")
        event = simpy.Event(self)
        event._ok = True
        event._value = None
        heappush(self._queue, (t, NORMAL, next(self._eid), event))
        return event
