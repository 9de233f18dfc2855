"""The Hydra entry point: compose and validate the config, run the task, write the outputs."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from cbsim.config import CbsimConfig, ConfigError
from cbsim.config.store import load_config, register_configs
from cbsim.metrics import compare_metrics, compute_metrics, format_table
from cbsim.trace import Trace, write_trace

log = logging.getLogger("cbsim")
register_configs()

METRICS_FILE = "metrics.json"
# written with metrics.json, last: a job directory holding both finished; a sweep run again
# over the same directory skips it (and redoes a job that stopped half-way)
JOB_CONFIG_FILE = "job_config.json"


def engines_of(config: CbsimConfig) -> list[str]:
    return ["sync", "async"] if config.engine.name == "compare" else [config.engine.name]


def _backend(config: CbsimConfig):
    """The back end's run(config, engine); for the runtime, checked for every engine up front."""
    if config.mode.name == "sim":
        from cbsim.sim import run

        return run
    try:
        from cbsim.runtime import run
        from cbsim.runtime.engine import check_device
    except ImportError as exc:
        raise ConfigError(
            f"mode=runtime needs the runtime extra (torch, transformers): {exc}; install with "
            "pip install 'cbsim[runtime]', or use mode=sim"
        ) from None
    for engine in engines_of(config):  # e.g. async on a CPU fails before sync has run
        check_device(config, engine)
    return run


def trace_name(engine: str, single: bool, gzip: bool) -> str:
    return ("trace.json" if single else f"trace_{engine}.json") + (".gz" if gzip else "")


def _write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


def finished_result(run_dir: Path, job_config: dict[str, Any]) -> dict[str, Any] | None:
    """The metrics of a job already finished in this directory with this very config."""
    metrics, stored = run_dir / METRICS_FILE, run_dir / JOB_CONFIG_FILE
    if not (metrics.is_file() and stored.is_file()):
        return None
    try:
        if json.loads(stored.read_text()) != job_config:
            return None
        return json.loads(metrics.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def run_engines(config: CbsimConfig, resolved: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """Run each engine, write its trace, and return the metrics object written to metrics.json."""
    backend = _backend(config)
    engines = engines_of(config)
    runs: dict[str, tuple[Trace, dict[str, Any]]] = {}
    for engine in engines:
        log.info("running %s engine in %s mode", engine, config.mode.name)
        try:
            trace = backend(config, engine)
        except KeyboardInterrupt as exc:
            partial = getattr(exc, "partial_trace", None)
            if partial is not None:
                path = run_dir / trace_name(engine + "_partial", False, config.output.trace_gzip)
                write_trace(partial, path)
                log.warning("interrupted: the trace so far is in %s", path)
            raise
        trace.other_data.setdefault("config", resolved)
        path = write_trace(
            trace, run_dir / trace_name(engine, len(engines) == 1, config.output.trace_gzip)
        )
        log.info("trace: %s", path)
        runs[engine] = (trace, compute_metrics(trace))
    if len(engines) == 1:
        metrics: dict[str, Any] = {"engine": engines[0], **runs[engines[0]][1]}
    else:
        metrics = {e: m for e, (_, m) in runs.items()}
        metrics["comparison"] = compare_metrics(runs["sync"][1], runs["async"][1])
    if config.output.report:
        from cbsim.report import write_run_report

        write_run_report(runs, config, run_dir / "report.html")
    if config.output.print_table:
        print(format_table({e: m for e, (_, m) in runs.items()}))
        if "comparison" in metrics:
            c = metrics["comparison"]
            print(
                f"async speedup x{c['speedup']:.3f}; GPU idle {c['gpu_idle_sync']:.2%} -> "
                f"{c['gpu_idle_async']:.2%}"
            )
    return metrics


def run_task(config: CbsimConfig, resolved: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    if config.task == "run":
        return run_engines(config, resolved, run_dir)
    from cbsim.validation.tasks import run_validation_task

    return run_validation_task(config, resolved, run_dir)


@hydra.main(version_base="1.3", config_path="pkg://cbsim.conf", config_name="config")
def main(cfg: DictConfig) -> dict[str, Any] | None:
    try:
        config = load_config(cfg)
    except ConfigError as exc:
        print(f"cbsim: config error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    done = finished_result(run_dir, resolved)
    if done is not None:
        log.info("already finished in %s: skipped (resume)", run_dir)
        return done
    # a run of another config (or a half-written one) may have left its markers here: this
    # run replaces them, and until it finishes the directory must not read as finished
    for stale in (JOB_CONFIG_FILE, METRICS_FILE):
        (run_dir / stale).unlink(missing_ok=True)
    try:
        metrics = run_task(config, resolved, run_dir)
    except ConfigError as exc:
        print(f"cbsim: config error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    _write_json_atomic(run_dir / METRICS_FILE, metrics)
    _write_json_atomic(run_dir / JOB_CONFIG_FILE, resolved)
    return metrics
