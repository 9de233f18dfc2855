"""Capacity: the highest Poisson arrival rate at which each engine still meets a latency SLO.

``python -m cbsim +experiment=capacity``: for each engine (sync and async with engine=compare) a
bisection over simulated runs of the configured online workload, the rate alone changed. A rate
passes when the run finished every request and its ``extra.stat`` (p99 by default) TTFT and TPOT
(and E2EL, when bounded) are within the config's ``slo`` bounds. The arrivals are one seeded draw
scaled by the rate, so latency grows with it and the bisection's bracket holds. A p99 over a few
hundred requests is close to the worst few, so the bisection runs once per arrival seed
(``extra.seeds``): the capacity is their median and the band their range. The first seed's rates
are also simulated on a log grid for the curve. Writes capacity.json and capacity.html (with the
profile whose costs it used) and prints the answer in one line.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from cbsim.config import CbsimConfig, ConfigError
from cbsim.metrics import compute_metrics
from cbsim.report.capacity_page import write_capacity_page
from cbsim.rundir import atomic_write_json
from cbsim.sim import run as sim_run

log = logging.getLogger("cbsim")
CAPACITY_FILE = "capacity.json"
CAPACITY_PAGE = "capacity.html"
STATS = ("mean", "median", "p99")
BOUNDED = ("ttft", "tpot", "e2el")
# the extra keys task=capacity reads, each with what it does (and its default)
EXTRA_KEYS = {
    "stat": "the statistic of TTFT/TPOT/E2EL held to the slo bounds: mean, median or p99 (p99)",
    "rate_min": "the lowest arrival rate tried, req/s (1)",
    "rate_max": "the highest arrival rate tried, req/s (64)",
    "tolerance": "the bisection stops when its bracket is this share of its upper end (0.03)",
    "curve_points": "rates on a log grid from rate_min to rate_max simulated for the curve (8)",
    "seeds": "arrival draws, each bisected on its own: the median and the range across them (3)",
    "progress": "a progress bar over the simulations on stderr (true)",
}


@dataclasses.dataclass(frozen=True)
class CapacityOptions:
    stat: str = "p99"
    rate_min: float = 1.0
    rate_max: float = 64.0
    tolerance: float = 0.03
    curve_points: int = 8
    seeds: int = 3
    progress: bool = True

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> CapacityOptions:
        """The options from config.extra, each checked with its key named."""
        for key in extra:
            if key not in EXTRA_KEYS:
                raise ConfigError(
                    f"extra.{key}={extra[key]} is not a setting of task=capacity; allowed: "
                    + ", ".join(sorted(EXTRA_KEYS))
                )
        opts = cls(**{k: v for k, v in extra.items() if k in EXTRA_KEYS})
        if opts.stat not in STATS:
            raise ConfigError(f"extra.stat={opts.stat}; allowed: {', '.join(STATS)}")
        for key in ("rate_min", "rate_max", "tolerance"):
            v = getattr(opts, key)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"extra.{key}={v} must be a finite number > 0")
        if opts.rate_min >= opts.rate_max:
            raise ConfigError(
                f"extra.rate_min={opts.rate_min} must be below extra.rate_max={opts.rate_max}"
            )
        if opts.tolerance >= 1:
            raise ConfigError(f"extra.tolerance={opts.tolerance}; allowed: between 0 and 1")
        if not isinstance(opts.curve_points, int) or not 0 <= opts.curve_points <= 64:
            raise ConfigError(f"extra.curve_points={opts.curve_points}; allowed: 0 to 64")
        if not isinstance(opts.seeds, int) or not 1 <= opts.seeds <= 32:
            raise ConfigError(f"extra.seeds={opts.seeds}; allowed: 1 to 32")
        if not isinstance(opts.progress, bool):
            raise ConfigError(f"extra.progress={opts.progress}; allowed: true or false")
        return opts

    def simulations(self) -> int:
        """About how many simulations one engine takes: each seed's bisection, and the curve."""
        steps = math.ceil(math.log(math.log(self.rate_max / self.rate_min) / self.tolerance, 2))
        return self.seeds * (2 + max(steps, 0)) + self.curve_points


def slo_bounds(config: CbsimConfig) -> dict[str, float]:
    """The bounded latencies (ttft, tpot, e2el) and their bounds in ms."""
    bounds = {k: getattr(config.slo, f"{k}_ms") for k in BOUNDED}
    bounds = {k: float(v) for k, v in bounds.items() if v is not None}
    if not bounds:
        raise ConfigError(
            "task=capacity needs an SLO: set slo.ttft_ms and/or slo.tpot_ms (ms), e.g. "
            "slo.ttft_ms=500 slo.tpot_ms=50"
        )
    return bounds


def meets(m: dict[str, Any], bounds: dict[str, float], stat: str, requests: int) -> bool:
    """Every request finished and each bounded latency's statistic within its bound."""
    if (m.get("requests_finished") or 0) < requests:
        return False
    return all(
        m.get(f"{stat}_{k}_ms") is not None and m[f"{stat}_{k}_ms"] <= b for k, b in bounds.items()
    )


class Probe:
    """Simulates one engine at a rate (each rate once) and keeps every point for the curve."""

    def __init__(
        self, config: CbsimConfig, engine: str, opts: CapacityOptions, bar: Any = None
    ) -> None:
        self.config, self.engine, self.opts, self.bar = config, engine, opts, bar
        self.bounds = slo_bounds(config)
        self.points: dict[float, dict[str, Any]] = {}

    @staticmethod
    def key(rate: float) -> float:
        """A rate as tried and reported: six significant digits."""
        return float(f"{rate:.6g}")

    def __call__(self, rate: float) -> bool:
        rate = self.key(rate)
        if rate not in self.points:
            w = dataclasses.replace(self.config.workload, rate=rate)
            m = compute_metrics(sim_run(dataclasses.replace(self.config, workload=w), self.engine))
            keys = [f"{s}_{k}_ms" for s in STATS for k in BOUNDED]
            point = {"rate": rate, **{k: m.get(k) for k in keys}}
            point["requests_finished"] = m.get("requests_finished")
            point["request_throughput"] = m.get("request_throughput")
            point["meets_slo"] = meets(
                m, self.bounds, self.opts.stat, self.config.workload.total_requests
            )
            self.points[rate] = point
            if self.bar is not None:
                self.bar.update(1)
            log.debug("capacity %s at %.4g req/s: %s", self.engine, rate, point["meets_slo"])
        return self.points[rate]["meets_slo"]

    def curve(self) -> list[dict[str, Any]]:
        return [self.points[r] for r in sorted(self.points)]


def capacity(probe: Probe) -> tuple[float | None, bool]:
    """(the highest passing rate found, whether it is only a lower bound: rate_max passed);
    None when even rate_min misses the SLO. Bisection in log rate."""
    lo, hi = probe.key(probe.opts.rate_min), probe.key(probe.opts.rate_max)
    if not probe(lo):
        return None, False
    if probe(hi):
        return hi, True
    while (hi - lo) / hi > probe.opts.tolerance:
        mid = probe.key(math.sqrt(lo * hi))
        lo, hi = (mid, hi) if probe(mid) else (lo, mid)
    return lo, False


def answer_line(result: dict[str, Any]) -> str:
    """The answer in one line: each engine's median capacity over the seeds and its range."""
    stat = result["stat"]
    slo = " and ".join(f"{stat} {k.upper()} <= {b:g} ms" for k, b in result["slo"].items())
    parts = []
    for engine, r in result["engines"].items():
        rate = r["capacity_rate"]
        text = "misses the SLO at every rate tried" if rate is None else f"{rate:.3g} req/s"
        low, high = r["band"]
        if rate is not None and low is not None and high > low:
            text += f" ({low:.3g}-{high:.3g} over {len(r['seed_rates'])} seeds)"
        if r["at_least"]:
            text = f"at least {text} (the highest rate tried)"
        parts.append(f"{engine} {text}")
    line = f"capacity under {slo}: " + ", ".join(parts)
    rates = [r["capacity_rate"] for r in result["engines"].values()]
    if len(rates) == 2 and all(rates):
        line += f" (async/sync x{rates[1] / rates[0]:.2f})"
    return line + f"; costs of hardware={result['hardware']}"


def engine_capacity(
    config: CbsimConfig, engine: str, opts: CapacityOptions, bar: Any
) -> dict[str, Any]:
    """One engine: a bisection per arrival seed, the curve on the first seed's arrivals."""
    rates, at_least, curve = [], False, []
    for i in range(opts.seeds):
        w = dataclasses.replace(config.workload, seed=config.workload.seed + i)
        probe = Probe(dataclasses.replace(config, workload=w), engine, opts, bar)
        rate, top = capacity(probe)
        rates.append(rate)
        at_least = at_least or top
        if i == 0:
            n = opts.curve_points
            for j in range(n):
                probe(opts.rate_min * (opts.rate_max / opts.rate_min) ** (j / max(n - 1, 1)))
            curve = probe.curve()
    found = [r for r in rates if r is not None]
    median = statistics.median(found) if len(found) == len(rates) else None
    band = [min(found), max(found)] if found else [None, None]
    return {
        "capacity_rate": median,
        "band": band,
        "seed_rates": rates,
        "at_least": at_least,
        "curve": curve,
    }


def _bar(opts: CapacityOptions, engines: list[str], show: bool) -> Any:
    if not (opts.progress and show):
        return None
    try:
        import tqdm
    except ImportError:
        return None
    total = opts.simulations() * len(engines)
    return tqdm.tqdm(total=total, desc="capacity", unit="sim", file=sys.stderr)


def run_capacity_task(config: CbsimConfig, run_dir: Path) -> dict[str, Any]:
    """Find each engine's capacity, simulate the curve, write capacity.json/.html."""
    if config.mode.name != "sim":
        raise ConfigError("task=capacity bisects over simulations; allowed: mode=sim")
    if config.workload.arrival != "poisson":
        raise ConfigError(
            f"workload.arrival={config.workload.arrival}: task=capacity varies the arrival rate; "
            "allowed: workload.arrival=poisson"
        )
    opts = CapacityOptions.from_extra(dict(config.extra))
    engines = ["sync", "async"] if config.engine.name == "compare" else [config.engine.name]
    result: dict[str, Any] = {
        "stat": opts.stat,
        "slo": slo_bounds(config),
        "requests": config.workload.total_requests,
        "seeds": [config.workload.seed + i for i in range(opts.seeds)],
        "hardware": config.hardware.name,
        "hardware_source": config.hardware.source,
        "engines": {},
    }
    bar = _bar(opts, engines, config.output.progress is not False)
    try:
        for engine in engines:
            result["engines"][engine] = engine_capacity(config, engine, opts, bar)
    finally:
        if bar is not None:
            bar.total = bar.n  # rates the curve shares with a bisection ran once
            bar.close()
    result["answer"] = answer_line(result)
    atomic_write_json(Path(run_dir) / CAPACITY_FILE, result)
    write_capacity_page(result, Path(run_dir) / CAPACITY_PAGE, config.description)
    print(result["answer"])
    return result
