"""Predicted bands for validated runs: how far the host-speed spread the profile carries moves a
run's total time, GPU idle and async speedup, placed around the simulated value, so each run can
say whether the recording lies inside P5-P95.

The draws are cbsim.bands' (its host-speed factors and scaled host costs, the host's levels
realized, the forward model's error; seeded), each engine simulated with its own recorded config
and measured as the validation measures it; each band is then widened by the profile's model
error (``hardware.model_error``, cbsim.widening)."""

from __future__ import annotations

from typing import Any

from cbsim.bands import band, drawn_profiles
from cbsim.config.model_error import ModelError
from cbsim.config.schema import HardwareConfig
from cbsim.validation.forked import forked_map
from cbsim.validation.measure import banded_metrics, simulate_like
from cbsim.validation.runs import BANDED, RunResult
from cbsim.validation.speedup import Speedup
from cbsim.widening import widen


def drawn_metrics(result: RunResult, hw: HardwareConfig) -> list[dict[str, float]]:
    """Per draw of ``hw``'s spread (cbsim.bands.drawn_profiles: host speed, the host's levels,
    the forward model's error, as the run's engine meets them): the banded metrics of the run
    simulated so."""
    out = []
    for drawn in drawn_profiles(hw, result.rec.engine):
        m = banded_metrics(simulate_like(result.rec, drawn))
        out.append({k: float(m[k]) for k in BANDED})
    return out


def around(value: float, q: dict[str, float]) -> tuple[float, float]:
    """The band's P5 and P95 moved by the distance of ``value`` from the band's median."""
    return value + q["p5"] - q["median"], value + q["p95"] - q["median"]


def attach(result: RunResult, draws: list[dict[str, float]], error: ModelError) -> None:
    for metric in BANDED:
        value = result.sim.get(metric)
        values = [d[metric] for d in draws if metric in d]
        if value is not None and values:
            raw = around(float(value), band(values))
            result.draw_band[metric] = raw
            result.band[metric] = widen(metric, float(value), *raw, error)


def _drawn(result: RunResult) -> list[dict[str, float]]:
    return drawn_metrics(result, result.hardware)


def all_draws(runs: list[RunResult], jobs: int, show: bool) -> list[list[dict[str, float]]]:
    """Each run's draws, in ``jobs`` forked worker processes (0: one per CPU; 1: here). The
    draws are seeded, so the bands do not depend on how many workers drew them."""
    return forked_map(_drawn, runs, jobs, "drawing bands", show)


def attach_bands(
    results: list[RunResult], pairs: list[Speedup], show: bool = True, jobs: int = 1
) -> None:
    """Bands on every run with a profile, and on every pair whose runs share one (draw by draw:
    the speedup of the call each draw stands for)."""
    runs = [r for r in results if r.hardware is not None]
    draws: dict[int, list[dict[str, Any]]] = {}
    for r, drawn in zip(runs, all_draws(runs, jobs, show)):
        draws[id(r)] = drawn
        attach(r, drawn, r.hardware.model_error)
    for p in pairs:
        if p.predicted is None or p.sync.hardware is not p.async_.hardware:
            continue
        key = "total_time_s"
        s, a = draws.get(id(p.sync), []), draws.get(id(p.async_), [])
        ratios = [x[key] / y[key] for x, y in zip(s, a) if x.get(key) and y.get(key)]
        if ratios:
            p.draw_band = around(p.predicted, band(ratios))
            p.band = widen("speedup", p.predicted, *p.draw_band, p.sync.hardware.model_error)
