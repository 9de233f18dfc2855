"""What a calibration produces: the fitted profile and the residuals table, one row per group of
spans fitted together, plus the small helpers every fit shares."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cbsim.calibration.fit import Fit
from cbsim.config.schema import HardwareConfig


@dataclass
class Row:
    """One line of the residuals table: a group of terms fitted on the same spans."""

    what: str
    samples: int
    fit: Fit
    prior: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "samples": self.samples,
            "rms_pct": self.fit.rms_pct,
            "max_pct": self.fit.max_pct,
            "terms": {
                k: {"value": v, "prior": self.prior.get(k), "fitted": self.fit.fitted[k]}
                for k, v in self.fit.values.items()
            },
        }


@dataclass
class Calibration:
    hardware: HardwareConfig
    rows: list[Row] = field(default_factory=list)
    traces: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # dotted key -> where a value came from, for values no row of the table fitted (measured
    # by a stage of its own, such as the uneven share or the model error)
    provenance: dict[str, str] = field(default_factory=dict)

    def table(self) -> str:
        lines = [f"{'spans':<22}{'n':>6}{'rms %':>8}{'max %':>8}  terms (fitted | kept=prior)"]
        for r in self.rows:
            terms = ", ".join(
                f"{k}={_fmt(v)}" + ("" if r.fit.fitted[k] else " (kept)")
                for k, v in r.fit.values.items()
            )
            lines.append(
                f"{r.what:<22}{r.samples:>6}{r.fit.rms_pct:>8.2f}{r.fit.max_pct:>8.2f}  {terms}"
            )
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    def as_dict(self) -> dict[str, Any]:
        return {
            "traces": self.traces,
            "notes": self.notes,
            "provenance": self.provenance,
            "rows": [r.as_dict() for r in self.rows],
            "hardware": dataclasses.asdict(self.hardware),
        }


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def set_quantile(
    cal: Calibration,
    what: str,
    y: np.ndarray,
    obj: Any,
    attr: str,
    offset: float = 0.0,
    per: float = 1.0,
    q: float = 50.0,
) -> None:
    """obj.attr = (percentile q of y - offset) / per: a term that is one constant per span."""
    prior = getattr(obj, attr)
    value = max((float(np.percentile(y, q)) - offset) / per, 0.0)
    setattr(obj, attr, value)
    # relative to the typical span: a wake-up of ~0 us would make a relative error meaningless
    res = (value * per + offset - y) / max(float(np.median(np.abs(y))), 1e-9)
    cal.rows.append(Row(what, len(y), Fit({attr: value}, {attr: True}, res), {attr: prior}))


def outliers(rel: np.ndarray) -> np.ndarray:
    """Samples whose relative residual is more than 10 robust deviations (and 5%) from the
    median; none when that would be over a fifth of the data (then the model is what is off)."""
    dev = np.abs(rel - np.median(rel))
    mad = 1.4826 * float(np.median(dev))
    out = dev > max(10.0 * mad, 0.05)
    return out if out.sum() <= 0.2 * len(rel) else np.zeros(len(rel), dtype=bool)


def label_out(what: str, out: np.ndarray) -> str:
    return f"{what} ({int(out.sum())} outliers out)" if out.any() else what
