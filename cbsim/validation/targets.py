"""The targets a validation is judged against on a held-out set recorded several times (issue
#39): each a number in ``extra.targets`` (conf/experiment/judge.yaml), defaulting to the issue's.

The defaults sit above the noise the brief measured between separate calls of one machine
(async speedup std 1.0-1.5 points, sync idle std 0.8-1.4 pp, async total 0.6%), which is why
the workloads are judged against the mean of their repeats, never one recording.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from cbsim.config import ConfigError

BASELINES = ("auto", "calibration", "others")


@dataclass(frozen=True)
class Targets:
    """Pass marks of the judged validation and the knobs of how it is judged."""

    # async speedup RMSE against the workload means, in points (100 x speedup)
    speedup_rmse_points: float = 1.0
    # ... and at least this much below the constant baseline's RMSE (0.3: 30% below)
    speedup_rmse_gain: float = 0.3
    # async total time |error| against the mean of the repeats: median and max, percent
    async_total_median_pct: float = 2.0
    async_total_max_pct: float = 5.0
    # sync total time |error|: median, percent
    sync_total_median_pct: float = 3.0
    # sync GPU idle |error|: median, percentage points
    sync_idle_median_pp: float = 1.0
    # a profile judged on another GPU's recordings (its kernel tables that GPU's, the rest the
    # profiled GPU's) or a datasheet-tier profile: every workload's async and sync total within
    # this many percent of its mean (issue #39: 4 across GPUs, 10 for the datasheet tier)
    other_gpu_total_max_pct: float = 4.0
    datasheet_total_max_pct: float = 10.0
    # recordings inside their P5-P95 speedup band: inside the binomial interval (at this
    # confidence) around this nominal share
    coverage_nominal: float = 0.9
    coverage_confidence: float = 0.9
    # median half-width of the predicted speedup band, in points
    band_half_width_points: float = 2.5
    # "async pays": the speedup at or above this; the band alone decides it (its P5 at or
    # above, or its P95 below) for at least decided_share of the workloads, with at most
    # wrong_share of those decisions contradicted by the recorded mean
    pays_at: float = 1.02
    decided_share: float = 0.7
    wrong_share: float = 0.05
    # the constant baseline: the median speedup of the calibration set (the in-sample runs),
    # of the other held-out workloads (leave one out), or auto (calibration when there is one)
    baseline: str = "auto"
    # bootstrap over workloads for the RMSE interval: resamples, confidence, seed
    bootstrap: int = 2000
    bootstrap_confidence: float = 0.9
    seed: int = 0

    def __post_init__(self) -> None:
        if self.baseline not in BASELINES:
            raise ConfigError(
                f"extra.targets.baseline={self.baseline!r}; allowed: {', '.join(BASELINES)}"
            )
        for key in ("speedup_rmse_gain", "coverage_nominal", "coverage_confidence"):
            _share(key, getattr(self, key))
        for key in ("decided_share", "wrong_share", "bootstrap_confidence"):
            _share(key, getattr(self, key))
        if self.bootstrap < 100:
            raise ConfigError(f"extra.targets.bootstrap={self.bootstrap}; allowed: >= 100")
        if self.pays_at <= 0:
            raise ConfigError(f"extra.targets.pays_at={self.pays_at}; allowed: a speedup > 0")


FIELDS = {f.name: f for f in dataclasses.fields(Targets)}


def _share(key: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"extra.targets.{key}={value}; allowed: a share in [0, 1]")


def targets_from(value: Any) -> Targets:
    """``extra.targets`` (a mapping of Targets' fields; None: the defaults) as Targets; an
    unknown key or a wrong type names the key and what is allowed."""
    if value is None:
        return Targets()
    if not hasattr(value, "items"):
        raise ConfigError(f"extra.targets={value!r}; allowed: a mapping of {', '.join(FIELDS)}")
    kwargs: dict[str, Any] = {}
    for key, v in value.items():
        if key == "source":
            continue  # where the numbers come from: read by people, kept in validation.json
        if key not in FIELDS:
            raise ConfigError(
                f"extra.targets.{key} is not a target; allowed: source, {', '.join(FIELDS)}"
            )
        default = FIELDS[key].default
        try:
            if isinstance(default, bool) or isinstance(default, str):
                kwargs[key] = type(default)(v)
            elif isinstance(default, int):
                if isinstance(v, float) and not v.is_integer():
                    raise ValueError
                kwargs[key] = int(v)
            else:
                kwargs[key] = float(v)
        except (TypeError, ValueError):
            kind = type(default).__name__
            raise ConfigError(f"extra.targets.{key}={v!r}; allowed: a {kind}") from None
    return Targets(**kwargs)


def targets_source(value: Any) -> str:
    """The ``source`` line of ``extra.targets``, or where the defaults come from."""
    if hasattr(value, "get") and value.get("source"):
        return str(value.get("source"))
    return "issue #39's targets (cbsim.validation.targets defaults)"
