"""The probes: short runs of the real engine, both engines, through the same path as
``python -m cbsim mode=runtime`` (cbsim.runtime.engine.execute), each trace written gzipped with
its run config, so the calibration can fit the host's per-phase costs from their spans.

A probe is a set of config values over the command's composed config (the probe list is in the
preset, conf/experiment/profile_machine.yaml); every probe's config is built and checked before
anything runs. The model is built once per profile and shared by every probe's runs.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cbsim.config import CbsimConfig, ConfigError
from cbsim.config.values import nest_keys
from cbsim.metrics import compute_metrics
from cbsim.profiling.budget import Budget
from cbsim.profiling.options import Probe
from cbsim.trace import write_trace

PROBES_DIR = "probes"


def _deep_update(tree: dict[str, Any], change: dict[str, Any]) -> None:
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(tree.get(key), dict):
            _deep_update(tree[key], value)
        else:
            tree[key] = value


def probe_config(
    config: CbsimConfig, model: dict[str, Any], probe: Probe
) -> tuple[CbsimConfig, dict]:
    """The probe's run config (both engines, task=run, the probe model) as objects and as the
    plain dict its traces carry (otherData.config)."""
    raw = copy.deepcopy(dataclasses.asdict(config))
    raw.update(task="run", trace=[], extra={}, description=f"profile probe {probe.name}")
    raw["model"] = copy.deepcopy(model)
    raw["engine"]["name"] = "compare"
    raw["mode"]["name"] = "runtime"
    _deep_update(raw, nest_keys(probe.values))
    try:
        merged = OmegaConf.merge(OmegaConf.structured(CbsimConfig), raw)
        obj = OmegaConf.to_object(merged)
    except (OmegaConfBaseException, ConfigError) as exc:
        first = str(exc).splitlines()[0]
        raise ConfigError(f"extra.probes {probe.name}: {first}") from None
    return obj, raw  # type: ignore[return-value]


def engines(config: CbsimConfig) -> list[str]:
    name = config.engine.name
    return ["sync", "async"] if name == "compare" else [name]


def check_probes(config: CbsimConfig, model: dict[str, Any], probes: list[Probe]) -> None:
    """Every probe's config, built and checked (ConfigError names the probe)."""
    for p in probes:
        probe_config(config, model, p)


def run_probes(
    config: CbsimConfig,
    model: dict[str, Any],
    probes: list[Probe],
    out: Path,
    budget: Budget,
    per_run_s: float,
    reserve_s: float = 0.0,
) -> dict[str, Any]:
    """Run each probe's engines ``repeat`` times into out/probes/<probe>[_<i>]/trace_<engine>.
    json.gz; returns per run its metrics, and the repeated probes' spread (the noise)."""
    from cbsim.runtime.engine import check_device, execute
    from cbsim.runtime.runner import runtime_model

    device = check_device(config, "sync")
    first, _ = probe_config(config, model, probes[0])
    # built once, as `python -m cbsim mode=runtime` builds it, and shared by every run
    shared = budget.run(
        f"build {first.model.name}", 20.0, lambda: runtime_model(first, device, None)
    )
    if shared is None:
        return {"runs": {}, "noise": {}}
    runs: dict[str, dict[str, Any]] = {}
    took: list[float] = []  # each run's seconds: the next run's estimate is their mean
    for probe in probes:
        cfg, raw = probe_config(config, model, probe)
        for i in range(probe.repeat):
            case = probe.name if probe.repeat == 1 else f"{probe.name}_{i + 1}"
            for engine in engines(cfg):
                step = f"probe {case} {engine}"
                if engine == "async" and device.type != "cuda":
                    budget.skip(step, "engine=async needs CUDA")
                    continue

                def once(cfg=cfg, engine=engine, model=shared):
                    return execute(cfg, engine, model=model).trace

                expected = statistics.fmean(took) if took else per_run_s
                budget.ahead_s = expected * (_left(probes, probe, i, engine) + 1) + reserve_s
                trace = budget.run(step, expected, once, reserve_s)
                if trace is None:
                    continue
                took.append(budget.steps[step]["seconds"])
                trace.other_data.setdefault("config", raw)
                folder = out / PROBES_DIR / case
                folder.mkdir(parents=True, exist_ok=True)
                write_trace(trace, folder / f"trace_{engine}.json.gz")
                m = compute_metrics(trace)
                runs[f"{case}/{engine}"] = {
                    "total_time_s": m["total_time_s"],
                    "gpu_idle_fraction": m["gpu_idle_fraction"],
                }
    return {"runs": runs, "noise": noise(probes, runs)}


def _left(probes: list[Probe], probe: Probe, i: int, engine: str) -> int:
    """Runs after this one (two engines a repeat)."""
    after = probes[probes.index(probe) + 1 :]
    return 2 * (probe.repeat - i - 1) + (engine == "sync") + 2 * sum(p.repeat for p in after)


def noise(probes: list[Probe], runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """For each repeated probe: the spread of its async speedup and of each engine's total time
    and GPU idle over its repetitions (the noise floor any prediction sits on)."""
    out = {}
    for p in (p for p in probes if p.repeat > 1):
        cases = [f"{p.name}_{i + 1}" for i in range(p.repeat)]
        got: dict[str, Any] = {"repeats": p.repeat}
        speedups = [
            runs[f"{c}/sync"]["total_time_s"] / runs[f"{c}/async"]["total_time_s"]
            for c in cases
            if f"{c}/sync" in runs and f"{c}/async" in runs
        ]
        if len(speedups) > 1:
            got["speedup_mean"] = statistics.fmean(speedups)
            got["speedup_std_points"] = 100 * statistics.stdev(speedups)
        for engine in ("sync", "async"):
            totals = [
                runs[f"{c}/{engine}"]["total_time_s"] for c in cases if f"{c}/{engine}" in runs
            ]
            idle = [
                runs[f"{c}/{engine}"]["gpu_idle_fraction"] for c in cases if f"{c}/{engine}" in runs
            ]
            if len(totals) > 1:
                got[f"{engine}_total_cv"] = statistics.stdev(totals) / statistics.fmean(totals)
                got[f"{engine}_idle_std_pp"] = 100 * statistics.stdev(idle)
        out[p.name] = got
    return out
