"""How much of this machine a run may take, checked before it starts (cbsim.sizing)."""

from __future__ import annotations

from dataclasses import dataclass, field

from cbsim.config.ranges import POSITIVE


@dataclass
class LimitsConfig:
    """The ceilings cbsim.sizing holds a run's estimate to; None: decided from the machine.

    A run over one of them is refused before any directory exists, in one line naming the key
    that makes it large, the estimate, the limit and this override."""

    # peak memory of the process, GB; None: 80% of this machine's physical memory
    max_memory_gb: float | None = field(default=None, metadata=POSITIVE)
    # the largest trace file a run writes, MB of JSON; None: what cbsim's own trace reader
    # accepts (cbsim.trace.load: 256 MiB and 1M events), so every trace written reads back
    max_trace_mb: float | None = field(default=None, metadata=POSITIVE)
