"""Every number in the config is finite and in its real range, checked from the schema itself.

A field's range comes from its metadata when it declares one::

    rms_norm_eps: float = field(default=1e-5, metadata=POSITIVE)

and otherwise from the unit in its name, so a new field gets the check by being named for what
it is: ``*_us``, ``*_us_per_*``, ``*_s``, ``*_bytes`` and ``*_spread`` are costs or sizes (>= 0);
``*_eff`` is an achieved fraction of a peak (0 < x <= 1); ``*_fraction`` is in [0, 1]; a
``*bandwidth`` or ``*flops`` rate is > 0. Every int and float field, with or without a range,
must be finite (NaN and inf are never a setting). The check walks the config objects once they
are built (a ``__post_init__`` check that meets a NaN first refuses it in the same form).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from cbsim.config.errors import ConfigError


@dataclass(frozen=True)
class Range:
    """Allowed values low..high; an open end excludes itself."""

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False

    def allows(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def describe(self) -> str:
        parts = []
        if self.low > -math.inf:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high < math.inf:
            parts.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        return " and ".join([*parts, "finite"])


def declare(r: Range) -> dict[str, Range]:
    """Field metadata declaring a range: ``field(default=..., metadata=declare(Range(1, 8)))``."""
    return {"range": r}


COST = declare(Range(0.0))
POSITIVE = declare(Range(0.0, low_open=True))
FRACTION = declare(Range(0.0, 1.0))
EFFICIENCY = declare(Range(0.0, 1.0, low_open=True))

# (how a field's name ends or what it holds, its range), first match wins
UNIT_RANGES: tuple[tuple[str, str, dict[str, Range]], ...] = (
    ("suffix", "_eff", EFFICIENCY),
    ("suffix", "_fraction", FRACTION),
    ("suffix", "_us", COST),
    ("infix", "_us_per_", COST),
    ("suffix", "_s", COST),
    ("suffix", "_bytes", COST),
    ("suffix", "_spread", COST),
    ("infix", "bandwidth", POSITIVE),
    ("infix", "flops", POSITIVE),
)


def field_range(f: dataclasses.Field) -> Range | None:
    """The field's declared range, else the one its unit implies, else None (finite only)."""
    if "range" in f.metadata:
        return f.metadata["range"]
    for how, text, meta in UNIT_RANGES:
        if (how == "suffix" and f.name.endswith(text)) or (how == "infix" and text in f.name):
            return meta["range"]
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_numbers(node: Any, prefix: str = "") -> None:
    """Walk the config objects (dataclass instances) and refuse the first number that is not
    finite or not in its field's range, naming the key and what is allowed."""
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            check_numbers(value, f"{key}.")
        elif _is_number(value):
            check_number(key, value, field_range(f))


def check_number(key: str, value: float, allowed: Range | None) -> None:
    r = allowed or Range()
    if not math.isfinite(value):
        raise ConfigError(f"{key}={value} is not a finite number; allowed: {r.describe()}")
    if not r.allows(value):
        raise ConfigError(f"{key}={value} is out of range; allowed: {r.describe()}")
