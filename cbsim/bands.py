"""Bands: how sure the simulator is, from the measured spread of host speed.

One simulation answers with one number, but the same run in two calls of the GPU machine does not
(the host is faster or slower between calls, it switches between a fast and a slow level within
a run, and it varies from step to step). The profile carries all three (``hardware.host.spread``,
``hardware.host.regimes``); ``predict_bands(cfg)`` simulates both engines ``draws`` times, each
draw with every host cost multiplied by a host-speed factor (log-normal with ``between_calls``,
drawn stratified so a few draws span the distribution), the host's level over time one seeded
realization of the regimes' two-state process per engine (cbsim/sim/host_speed.py: a short run
sees few switches and lands mostly fast or mostly slow, a long one averages them out; sync and
async run one after the other, so each meets its own stretch of it) and, when
``within_run`` is set, each host phase varied step to step around it; with
``hardware.gpu.spread.forward_error`` every forward also takes a drawn factor, the GPU model's own error
on runs it was not fitted on (a GPU-bound async run does not move with the host). It reports P5, median and
P95 of total time, GPU idle and the async speedup, each interval widened by the model's own error
on held-out runs when the profile carries one (``hardware.model_error``, cbsim/widening.py).
Seeded: the same config gives the same bands.

The dict (JSON-ready; for metrics.json, the printed table, the report, a sweep's summary)::

    {"draws": 9, "seed": 0, "between_calls": 0.29, "within_run": 0.23, "forward_error": 0.03,
     "regimes": {"slow_factor": 2.2, "fast_dwell_s": 1.0, "slow_dwell_s": 0.6},
     "model_error": {"total_time": 0.02, "gpu_idle": 0.4, "speedup": 0.01},  # when set
     "quantiles": ["p5", "median", "p95"],
     "sync":  {"total_time_s": {"p5": .., "median": .., "p95": ..},
               "gpu_idle_fraction": {"p5": .., "median": .., "p95": ..}},
     "async": {... the same ...},
     "speedup": {"p5": .., "median": .., "p95": ..}}     # sync total / async total, per draw

Cost: 2 x draws simulations (both engines, whatever ``engine`` says).
"""

from __future__ import annotations

import dataclasses
from statistics import NormalDist
from typing import Any

import numpy as np

import cbsim.sim as sim
from cbsim.config.hardware import HOST_TIMES_US, HostCosts, PhaseCost
from cbsim.config.model_error import ModelError
from cbsim.config.schema import CbsimConfig, HardwareConfig
from cbsim.metrics import MetricInputs, metrics_from
from cbsim.widening import widen

QUANTILES = {"p5": 5.0, "median": 50.0, "p95": 95.0}
METRICS = ("total_time_s", "gpu_idle_fraction")
# the engines in the order a compare runs them (a draw's host seeds and levels follow it)
ENGINES = ("sync", "async")
# mixed into the level strata's seed of the second engine: its own order of the strata
LEVEL_SALT = 7


def speed_factors(between_calls: float, draws: int, seed: int) -> list[float]:
    """Host-speed factors (cost multipliers), one per draw: log-normal, median one, one draw in
    each of ``draws`` equal-probability strata (seeded position inside the stratum)."""
    u = (np.arange(draws) + np.random.default_rng(seed).random(draws)) / draws
    normal = NormalDist()
    return [float(np.exp(between_calls * normal.inv_cdf(float(p)))) for p in u]


def scaled_host(
    host: HostCosts, factor: float, seed: int, level_quantile: float = -1.0
) -> HostCosts:
    """Every host cost times ``factor``; a draw's own variation on, seeded per draw: the
    step-to-step jitter and one realization of the host's regimes (starting slow when
    ``level_quantile`` is below the slow share; -1: as the seed draws it)."""

    spread = dataclasses.replace(host.spread, jitter=True, seed=seed, level_quantile=level_quantile)
    return dataclasses.replace(host_times_scaled(host, factor), spread=spread)


def host_times_scaled(host: HostCosts, factor: float) -> HostCosts:
    """Every host cost times ``factor``, nothing else changed (a faster or slower host)."""

    def phase(p: PhaseCost) -> PhaseCost:
        return PhaseCost(*(factor * getattr(p, f.name) for f in dataclasses.fields(PhaseCost)))

    return dataclasses.replace(
        host,
        schedule=phase(host.schedule),
        prepare=phase(host.prepare),
        update=phase(host.update),
        **{k: factor * getattr(host, k) for k in HOST_TIMES_US},
    )


def as_engine(cfg: CbsimConfig, engine: str) -> CbsimConfig:
    """The config run as ``engine`` (a band compares both whatever ``engine.name`` says; async
    needs the carry-over)."""
    carry = {"carry_over": True} if engine == "async" else {}
    return dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, name=engine, **carry))


def _simulate(cfg: CbsimConfig, engine: str) -> dict[str, Any]:
    """The metrics of one simulation, through the simulator's trace-less path (its metric tables:
    the same numbers as the trace's, no events built)."""
    result = sim.simulate(cfg, engine)
    return metrics_from(MetricInputs(**result.tables))


def forward_scales(forward_error: float, draws: int, seed: int) -> list[float]:
    """The forward model's error per draw: stratified like the host factors, its strata in a
    seeded order of their own (the two are independent)."""
    scales = speed_factors(forward_error, draws, seed + 7919)
    order = np.random.default_rng(seed + 104729).permutation(draws)
    return [scales[i] for i in order]


def drawn_profiles(hw: HardwareConfig, engine: str = "sync") -> list[HardwareConfig]:
    """The profile as each draw runs ``engine``: every host cost times the draw's host-speed
    factor, every forward times the draw's forward-model error, the draw's step jitter and
    realization of the host's levels. A compare runs sync and then async in one call, so the
    two engines of a draw share its factor and forward error (the call's) but each meets its
    own stretch of the host's levels and jitter (seeded per engine and draw). The same draws
    for predict_bands and validation."""
    spread, gpu_spread = hw.host.spread, hw.gpu.spread
    host_factors = speed_factors(spread.between_calls, spread.draws, spread.seed)
    scales = forward_scales(gpu_spread.forward_error, spread.draws, spread.seed)
    nth = ENGINES.index(engine)
    levels = level_quantiles(spread.draws, spread.seed + nth * LEVEL_SALT)
    out = []
    for i, (factor, scale) in enumerate(zip(host_factors, scales)):
        host = scaled_host(hw.host, factor, spread.seed + 1 + nth * spread.draws + i, levels[i])
        drawn_gpu = dataclasses.replace(gpu_spread, forward_scale=gpu_spread.forward_scale * scale)
        gpu = dataclasses.replace(hw.gpu, spread=drawn_gpu)
        out.append(dataclasses.replace(hw, host=host, gpu=gpu))
    return out


def level_quantiles(draws: int, seed: int) -> list[float]:
    """Where each draw's starting host level falls: one draw in each of ``draws`` strata of
    [0, 1), in a seeded order of their own (so a few draws of a run shorter than a stay start
    slow in the slow share of them, not all fast by chance)."""
    rng = np.random.default_rng(seed + 15485863)
    u = (np.arange(draws) + rng.random(draws)) / draws
    return [float(u[i]) for i in rng.permutation(draws)]


def draw_metrics(cfg: CbsimConfig) -> list[dict[str, dict[str, float]]]:
    """Per draw, per engine: the metrics of ``METRICS``."""
    per_engine = {}
    for engine in ENGINES:
        runs = []
        for hw in drawn_profiles(cfg.hardware, engine):
            m = _simulate(as_engine(dataclasses.replace(cfg, hardware=hw), engine), engine)
            runs.append({k: float(m[k]) for k in METRICS})
        per_engine[engine] = runs
    return [dict(zip(ENGINES, same_draw)) for same_draw in zip(*per_engine.values())]


def band(values: list[float]) -> dict[str, float]:
    return {name: float(np.percentile(values, q)) for name, q in QUANTILES.items()}


def widened(metric: str, q: dict[str, float], error: ModelError) -> dict[str, float]:
    """A band of draws with the model's own error added around its median (cbsim.widening)."""
    lo, hi = widen(metric, q["median"], q["p5"], q["p95"], error)
    return {"p5": lo, "median": q["median"], "p95": hi}


def predict_bands(cfg: CbsimConfig) -> dict[str, Any]:
    """P5 / median / P95 of total time and GPU idle per engine, and of the async speedup (sync
    total / async total of the same draw), over the profile's host-speed spread."""
    spread = cfg.hardware.host.spread
    draws = draw_metrics(cfg)
    result: dict[str, Any] = {
        "draws": spread.draws,
        "seed": spread.seed,
        "between_calls": spread.between_calls,
        "within_run": spread.within_run,
        "forward_error": cfg.hardware.gpu.spread.forward_error,
        "regimes": dataclasses.asdict(cfg.hardware.host.regimes),
        "quantiles": list(QUANTILES),
    }
    error = cfg.hardware.model_error
    if error.any:
        result["model_error"] = dataclasses.asdict(error)
    for engine in ENGINES:
        result[engine] = {
            k: widened(k, band([d[engine][k] for d in draws]), error) for k in METRICS
        }
    speedups = [d["sync"]["total_time_s"] / d["async"]["total_time_s"] for d in draws]
    result["speedup"] = widened("speedup", band(speedups), error)
    return result


def _regimes_text(regimes: dict[str, float] | None) -> str:
    """The regimes in the band's header line, when the host has two levels."""
    if not regimes or regimes["slow_factor"] <= 1 or regimes["slow_dwell_s"] <= 0:
        return ""
    return (
        f", a slow level x{regimes['slow_factor']:.3g} (mean stays {regimes['fast_dwell_s']:.3g} s "
        f"fast, {regimes['slow_dwell_s']:.3g} s slow)"
    )


def _model_error_text(error: dict[str, float] | None) -> str:
    """The model's own error in the band's header line, when the profile carries one."""
    if not error:
        return ""
    parts = ", ".join(f"{k} {v:.3g}" for k, v in error.items())
    return f", widened by the model's error on held-out runs ({parts})"


def format_bands(bands: dict[str, Any]) -> str:
    """The printed form of ``predict_bands``'s dict: P5 / median / P95 per line."""

    def three(b: dict[str, float], fmt: str) -> str:
        return " / ".join(fmt.format(b[q]) for q in QUANTILES)

    lines = [
        f"band: P5 / median / P95 over {bands['draws']} draws of host speed (spread "
        f"{bands['between_calls']:.3g} between calls, {bands['within_run']:.3g} within a run"
        f"{_regimes_text(bands.get('regimes'))}) and of the forward model's error "
        f"({bands['forward_error']:.3g}){_model_error_text(bands.get('model_error'))}"
    ]
    for engine in ("sync", "async"):
        b = bands[engine]
        lines.append(
            f"  {engine:5s} total {three(b['total_time_s'], '{:.3f}')} s, GPU idle "
            f"{three({q: 100 * v for q, v in b['gpu_idle_fraction'].items()}, '{:.2f}')}%"
        )
    lines.append(f"  async speedup {three(bands['speedup'], 'x{:.3f}')}")
    return "\n".join(lines)
