"""The Python API: a simulated run in a notebook, without Hydra's command line.

    import cbsim
    r = cbsim.simulate("+experiment=long_seq", "engine=compare")
    r                                        # one line: each engine's time and GPU idle
    r.metrics["async"]["total_time_s"]       # per engine, the numbers metrics.json holds
    r.metrics["comparison"]["speedup"]       # sync against async (engine=compare)
    r.metrics.get("bands")                   # P5 / median / P95 when mode.bands draws them
    r.table()                                # one row per engine, one column per metric
    r.steps.head()                           # one row per step and engine (pandas)
    r.spans.head()                           # one row per span and engine, ms from the start
    r.report("report.html")                  # the run report
    r.write_trace("trace.json.gz")           # for Perfetto: each engine one process
    cbsim.load_sweep("multirun/2026-12-01/10-00-00")   # the sweep's summary.csv as a DataFrame

The overrides are the command line's (``key=value``, ``+experiment=...``, ``group=option``),
composed and checked exactly as ``python -m cbsim`` does; a bad one raises ``ConfigError`` with
the same one-line message.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd
from hydra import compose as hydra_compose
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from cbsim.config import CbsimConfig, ConfigError
from cbsim.config.errors import describe_hydra_error
from cbsim.config.schema import OutputConfig
from cbsim.config.store import load_config, register_configs
from cbsim.job_metrics import wants_bands
from cbsim.metrics import compare_metrics, compute_metrics
from cbsim.metrics.table import SUMMARY_ROWS
from cbsim.report import write_run_report
from cbsim.report.frames import RunFrames, run_frames
from cbsim.rundir import SUMMARY_FILE
from cbsim.sim import run as sim_run
from cbsim.sizing import check_size
from cbsim.sweep import write_summary
from cbsim.trace import Trace, read_traces, write_merged_trace, write_trace

__all__ = ["Result", "compose", "load_sweep", "load_traces", "simulate"]


def compose(*overrides: str) -> CbsimConfig:
    """The checked config of the command line ``python -m cbsim OVERRIDES...``
    (hardware=<profile directory | auto> as the command line takes it)."""
    from cbsim.profiling.select import rewrite

    register_configs()
    overrides = tuple(rewrite(list(overrides)))
    try:
        if GlobalHydra.instance().is_initialized():  # inside a Hydra app: compose there
            return load_config(hydra_compose(config_name="config", overrides=list(overrides)))
        with initialize_config_module(config_module="cbsim.conf", version_base="1.3"):
            cfg = hydra_compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(describe_hydra_error(exc) or str(exc)) from None
    return load_config(cfg)


@dataclass(repr=False)
class Result:
    """One run: its config, a trace per engine and the metrics.

    ``metrics`` has one shape for one engine and for several: each engine's metrics under its
    name, ``comparison`` (sync against async) when both ran, ``bands`` when drawn."""

    config: CbsimConfig | None
    traces: dict[str, Trace]
    metrics: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        """One line (a notebook cell shows it): each engine's time and GPU idle, the speedup."""
        parts = [_engine_line(e, m) for e, m in self.engine_metrics().items()]
        speedup = (self.metrics.get("comparison") or {}).get("speedup")
        if speedup:
            parts.append(f"async x{speedup:.3f}")
        text = "Result(" + "; ".join(parts) + ")"
        return text if len(text) <= REPR_CHARS else text[: REPR_CHARS - 4] + "...)"

    def _repr_html_(self) -> str:
        """A small table for a notebook: the printed table's rows, one column per engine."""
        engines = self.engine_metrics()
        rows = {
            label: [_cell(m.get(key), fmt) for m in engines.values()]
            for label, key, fmt in SUMMARY_ROWS
            if any(m.get(key) is not None for m in engines.values())
        }
        table = pd.DataFrame.from_dict(rows, orient="index", columns=list(engines))
        speedup = (self.metrics.get("comparison") or {}).get("speedup")
        note = f"<p>async speedup x{speedup:.3f}</p>" if speedup else ""
        return table.to_html() + note

    @cached_property
    def frames(self) -> dict[str, RunFrames]:
        """The report's tables per engine (cbsim.report.frames)."""
        return {e: run_frames(e, t) for e, t in self.traces.items()}

    @cached_property
    def steps(self) -> pd.DataFrame:
        """Per engine and step: end_ms, step_ms, gpu_ms (GPU busy in it), exposed_ms (the rest:
        the GPU waited for the CPU) and the batch kind."""
        return _stacked({e: f.steps for e, f in self.frames.items()})

    @cached_property
    def spans(self) -> pd.DataFrame:
        """Per engine every span, in ms from the run's start: lane, name, ts_ms, end_ms, dur_ms
        and its batch's fields."""
        frames = {}
        for e, f in self.frames.items():
            spans = f.spans.rename(columns={"dur_us": "dur_ms"})
            spans["dur_ms"] = spans["dur_ms"] / 1e3
            frames[e] = spans
        return _stacked(frames)

    def engine_metrics(self) -> dict[str, dict[str, Any]]:
        """The metrics by engine (``metrics`` less the comparison and the bands)."""
        return {e: self.metrics[e] for e in self.traces}

    def table(self) -> pd.DataFrame:
        """One row per engine (the index), one column per number metrics.json holds for it."""
        rows = {
            e: {k: v for k, v in m.items() if _is_scalar(v)}
            for e, m in self.engine_metrics().items()
        }
        table = pd.DataFrame.from_dict(rows, orient="index")
        table.index.name = "engine"
        first = [c for c in HEADLINE if c in table.columns]
        return table[[*first, *(c for c in table.columns if c not in first)]]

    def report(self, path: str | os.PathLike[str] = "report.html") -> Path:
        """Write the run report (self-contained HTML) and return its path."""
        runs = {e: (t, self.metrics[e]) for e, t in self.traces.items()}
        bands = self.metrics.get("bands")
        return write_run_report(runs, self.config, Path(path), files=[], bands=bands)

    def write_trace(self, path: str | os.PathLike[str]) -> Path:
        """Write the trace for Perfetto (gzipped when the name ends in .gz): one engine's as it
        is, several as one file with each engine a process (``load_traces`` gives them back)."""
        if len(self.traces) == 1:
            return write_trace(next(iter(self.traces.values())), path)
        return write_merged_trace(self.traces, path)


# the metrics a notebook sees first (the first columns of the table)
HEADLINE = (
    "total_time_s",
    "steps",
    "generated_tokens",
    "tokens_per_s",
    "gpu_idle_fraction",
    "cpu_blocked_fraction",
    "step_time_ms_p50",
    "median_ttft_ms",
    "median_tpot_ms",
)
REPR_CHARS = 120


def _engine_line(engine: str, m: dict[str, Any]) -> str:
    total, idle = m.get("total_time_s"), m.get("gpu_idle_fraction")
    t = f"{total:.4g} s" if isinstance(total, (int, float)) else "-"
    i = f"{idle:.1%}" if isinstance(idle, (int, float)) else "-"
    return f"{engine} {t}, GPU idle {i}"


def _cell(v: Any, fmt: str) -> str:
    ok = v is not None and not (isinstance(v, float) and math.isnan(v))
    return fmt.format(v) if ok else "-"


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def _stacked(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    parts = [f.assign(engine=e)[["engine", *f.columns]] for e, f in frames.items()]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _metrics(runs: dict[str, tuple[Trace, dict[str, Any]]]) -> dict[str, Any]:
    """Each engine's metrics under its name, and sync against async when both ran."""
    out: dict[str, Any] = {e: m for e, (_, m) in runs.items()}
    if "sync" in out and "async" in out:
        out["comparison"] = compare_metrics(out["sync"], out["async"])
    return out


def simulate(*overrides: str, config: CbsimConfig | None = None) -> Result:
    """Simulate the run ``python -m cbsim OVERRIDES...`` describes (or a given config)."""
    config = config if config is not None else compose(*overrides)
    if config.mode.name != "sim":
        raise ConfigError(
            f"mode={config.mode.name}: simulate() runs the simulator; allowed: mode=sim "
            "(the real engine runs from the command line: python -m cbsim mode=runtime ...)"
        )
    if config.task != "run":
        raise ConfigError(f"task={config.task}: simulate() runs task=run")
    # every trace kept in memory, none written: sized as a run that reports and writes no trace
    check_size(dataclasses.replace(config, output=OutputConfig(trace=False, report=True)))
    engines = ["sync", "async"] if config.engine.name == "compare" else [config.engine.name]
    runs = {}
    resolved = dataclasses.asdict(config)  # as the app records it: metrics read it
    for engine in engines:
        trace = sim_run(config, engine)
        trace.other_data.setdefault("config", resolved)
        memory = trace.other_data.get("memory") or {}
        fit = {
            "fits_device": memory.get("fits_device"),
            "device_bytes_needed": memory.get("device_bytes_needed"),
            "device_bytes_available": config.hardware.memory_bytes,
        }
        runs[engine] = (trace, {**compute_metrics(trace), **fit})
    metrics = _metrics(runs)
    if wants_bands(config, in_sweep=False):  # as a single run of the command line
        from cbsim.bands import predict_bands

        metrics["bands"] = predict_bands(config)
    return Result(config, {e: t for e, (t, _) in runs.items()}, metrics)


def load_traces(*paths: str | os.PathLike[str]) -> Result:
    """Traces from files (sim, runtime or a Kineto import) as a Result, keyed by engine; a
    merged trace (sync and async in one file) gives its runs."""
    runs_of = [(t, p) for p in paths for t in read_traces(p).values()]
    traces, paths = [t for t, _ in runs_of], tuple(p for _, p in runs_of)
    keys = [t.engine or Path(p).name for t, p in zip(traces, paths)]
    if len(set(keys)) < len(keys):
        keys = [str(p) for p in paths]
    runs = {k: (t, compute_metrics(t)) for k, t in zip(keys, traces)}
    return Result(None, dict(zip(keys, traces)), _metrics(runs))


def load_sweep(sweep_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """A sweep directory's summary (one row per job: overrides, status, metrics); written
    from what is on disk when summary.csv is missing."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"{sweep_dir}: no such sweep directory")
    path = sweep_dir / SUMMARY_FILE
    if not path.is_file():
        path = write_summary(sweep_dir, html=False).summary
    return pd.read_csv(path)
