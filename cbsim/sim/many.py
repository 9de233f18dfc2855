"""Many configurations simulated in one process, without traces: a grid sweep's route.

Every engine of every config (sync and async for ``engine=compare``) is simulated to its metric
inputs (the run folded, cbsim.sim.simulate) and handed to ``measure``, the caller's metrics function (the simulator sits below
cbsim.metrics, so the caller passes it in: ``lambda t: metrics_from(MetricInputs(**t))``).
Nothing is written; one config's failure (a ConfigError) is the caller's to catch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from cbsim.config.schema import CbsimConfig
from cbsim.sim.engine import simulate

Measure = Callable[[dict[str, Any]], dict[str, Any]]


def engines_of(config: CbsimConfig) -> list[str]:
    return ["sync", "async"] if config.engine.name == "compare" else [config.engine.name]


def simulate_many(
    configs: Iterable[CbsimConfig],
    measure: Measure,
    *,
    config_dicts: Iterable[dict[str, Any] | None] | None = None,
    fast_forward: bool = True,
) -> list[dict[str, dict[str, Any]]]:
    """Per config, ``{engine: measure(tables)}`` in the configs' order. ``config_dicts``: each
    config as the run's resolved dict (what a trace's otherData.config holds; default:
    ``dataclasses.asdict(config)``), for the metrics that read the config."""
    return list(iter_many(configs, measure, config_dicts=config_dicts, fast_forward=fast_forward))


def iter_many(
    configs: Iterable[CbsimConfig],
    measure: Measure,
    *,
    config_dicts: Iterable[dict[str, Any] | None] | None = None,
    fast_forward: bool = True,
) -> Iterator[dict[str, dict[str, Any]]]:
    """``simulate_many`` one config at a time (a caller can write each result as it comes)."""
    configs = list(configs)
    dicts = [None] * len(configs) if config_dicts is None else list(config_dicts)
    if len(dicts) != len(configs):
        raise ValueError(f"{len(dicts)} config_dicts for {len(configs)} configs")
    for config, as_dict in zip(configs, dicts):
        if as_dict is None:
            as_dict = dataclasses.asdict(config)
        yield {
            engine: measure(
                simulate(config, engine, config_dict=as_dict, fast_forward=fast_forward).tables
            )
            for engine in engines_of(config)
        }
