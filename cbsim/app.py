"""The entry point (python -m cbsim, cbsim): compose and check the config, run the task in a
locked run directory, write the outputs, and end with a one-line message on bad input or an
interrupt instead of a traceback."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cbsim.config import CbsimConfig, ConfigError
from cbsim.config.errors import describe_hydra_error
from cbsim.config.store import load_config, register_configs
from cbsim.interrupts import exit_code, interrupts_raise, signal_name
from cbsim.job_metrics import device_fit, run_metrics, wants_bands
from cbsim.metrics import (
    MetricInputs,
    compute_metrics,
    format_table,
    metrics_from,
    why_line,
)
from cbsim.rundir import (
    JOB_CONFIG_FILE,
    METRICS_FILE,
    REPORT_FILE,
    RunDirError,
    RunLock,
    atomic_write_json,
    clear_run_outputs,
    finished_metrics,
    trace_name,
    write_finished,
)
from cbsim.sim import simulate
from cbsim.sizing import unreadable
from cbsim.trace import Trace, write_trace

log = logging.getLogger("cbsim")
register_configs()


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


def _run_one(config: CbsimConfig, engine: str, single: bool, run_dir: Path, backend) -> Trace:
    """One engine's trace; an interrupt writes the trace so far as *_partial and goes on up."""
    log.debug("running %s engine in %s mode", engine, config.mode.name)
    try:
        return backend(config, engine)
    except KeyboardInterrupt as exc:
        partial = getattr(exc, "partial_trace", None)
        if partial is not None:
            name = trace_name(engine, single, bool(config.output.trace_gzip), partial=True)
            exc.cbsim_partial = write_trace(partial, run_dir / name)  # type: ignore[attr-defined]
        raise


def _untraced(config: CbsimConfig, engine: str, resolved: dict[str, Any]) -> tuple[Any, dict]:
    """A simulation that keeps no trace: the metrics from the simulator's own tables (the same
    numbers as from its trace, no events built) and, for the report, the run folded with the
    windows of spans its recorder kept (cbsim.report.untraced); memory that does not grow with
    the steps either way."""
    width = config.output.report_window_steps if config.output.report else None
    result = simulate(config, engine, want_trace=False, config_dict=resolved, window=width)
    inputs = MetricInputs(**result.tables)
    metrics = {**metrics_from(inputs), **device_fit(result.memory, config.hardware.memory_bytes)}
    if result.windows is None:
        return None, metrics
    from cbsim.report.untraced import UntracedRun

    other = {"memory": result.memory, "sim_counters": result.counters, "config": resolved}
    kept = result.windows
    run = UntracedRun(inputs, kept.windows, kept.width, kept.hazards, other)
    return run, metrics


def readable(config: CbsimConfig, events: int, engine: str) -> bool:
    """Whether a trace of ``events`` is one cbsim reads back (the estimate's check, made again
    on the trace itself); when not, it is not written and a line says why."""
    reason = unreadable(config, events)
    if reason is not None:
        print(f"cbsim: {engine} trace not written: {reason}", file=sys.stderr)
    return reason is None


def in_multirun() -> bool:
    """Whether this run is a job of a Hydra multirun (a sweep)."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _bands(config: CbsimConfig) -> dict[str, Any] | None:
    """cbsim.bands.predict_bands when mode.bands asks for it here, else None."""
    if not wants_bands(config, in_multirun()):
        return None
    from cbsim.bands import predict_bands

    log.debug("bands: %d draws per engine", config.hardware.host.spread.draws)
    return predict_bands(config)


def run_engines(config: CbsimConfig, resolved: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """Run each engine, write what config.output asks, and return the metrics object (with
    ``bands`` when mode.bands draws them). An interrupt carries the complete traces already
    written (``cbsim_written``), so its message can say what is on disk."""
    written: list[Path] = []
    try:
        return _run_engines(config, resolved, run_dir, written)
    except KeyboardInterrupt as exc:
        exc.cbsim_written = written  # type: ignore[attr-defined]
        raise


def _run_engines(
    config: CbsimConfig, resolved: dict[str, Any], run_dir: Path, written: list[Path]
) -> dict[str, Any]:
    backend = _backend(config)
    engines = engines_of(config)
    out = config.output
    runs: dict[str, tuple[Any, dict[str, Any]]] = {}
    for engine in engines:
        if config.mode.name == "sim" and not out.trace:
            runs[engine] = _untraced(config, engine, resolved)
            continue
        trace = _run_one(config, engine, len(engines) == 1, run_dir, backend)
        trace.other_data.setdefault("config", resolved)
        if out.trace and readable(config, len(trace.events), engine):
            name = trace_name(engine, len(engines) == 1, bool(out.trace_gzip))
            written.append(write_trace(trace, run_dir / name))
            log.debug("trace: %s", written[-1])
        memory = trace.other_data.get("memory") or {}
        # a recording checked its fit against its device's own memory (runtime/machine.py)
        available = (trace.other_data.get("device_fit") or {}).get("bytes_available")
        fit = device_fit(memory, available or config.hardware.memory_bytes)
        runs[engine] = (trace, {**compute_metrics(trace), **fit})
    metrics = run_metrics({e: m for e, (_, m) in runs.items()})
    bands = _bands(config)
    if bands is not None:
        metrics["bands"] = bands
    if out.report:
        from cbsim.report import write_run_report

        # a sweep's job reports share the sweep directory's one plotly.min.js
        js_dir = run_dir.parent if in_multirun() else None
        write_run_report(runs, config, run_dir / REPORT_FILE, js_dir, bands=bands)
    if out.print_table:
        print_table(runs, metrics)
    return metrics


def print_table(runs: dict[str, tuple[Trace | None, dict[str, Any]]], metrics: dict) -> None:
    """The metrics table, the async speedup of a pair, and the bands' lines under them."""
    print(format_table({e: m for e, (_, m) in runs.items()}))
    if "comparison" in metrics:
        c = metrics["comparison"]
        print(
            f"async speedup x{c['speedup']:.3f}; GPU idle {c['gpu_idle_sync']:.2%} -> "
            f"{c['gpu_idle_async']:.2%}"
        )
    if "bands" in metrics:
        from cbsim.bands import format_bands

        print(format_bands(metrics["bands"]))
    why = why_line({e: m for e, (_, m) in runs.items()})
    if why:
        print(why)


def run_task(config: CbsimConfig, resolved: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    if config.task == "run":
        return run_engines(config, resolved, run_dir)
    if config.task == "profile_kernels":
        return profile_kernels(config, run_dir)
    if config.task == "profile_machine":
        from cbsim.profiling.machine import run_profile_machine

        return run_profile_machine(config, run_dir, user_command())
    if config.task == "capacity":
        from cbsim.capacity import run_capacity_task

        return run_capacity_task(config, run_dir)
    if config.task == "record_set":
        from cbsim.validation.record_set import run_record_set

        return run_record_set(config, run_dir)
    if config.task == "datasheets":
        from cbsim.profiling.datasheet import run_datasheet_task

        return run_datasheet_task(config, run_dir, user_command())
    from cbsim.validation.tasks import run_validation_task

    return run_validation_task(config, resolved, run_dir)


# the command line as the user typed it, before hardware=<profile> is rewritten for Hydra
USER_ARGS: list[str] = []


def user_command() -> str:
    """The command that made a file, for its header or manifest, as the user wrote it."""
    return " ".join(["python -m cbsim", *(USER_ARGS or sys.argv[1:])])


def profile_kernels(config: CbsimConfig, run_dir: Path) -> dict[str, Any]:
    """Time the model's kernels on the GPU into a kernel table (runtime/profile_kernels.py)."""
    if config.mode.name != "runtime":
        raise ConfigError("task=profile_kernels times kernels on the GPU; allowed: mode=runtime")
    try:
        from cbsim.runtime.profile_kernels import run_profile
    except ImportError as exc:
        raise ConfigError(f"task=profile_kernels needs the runtime extra (torch): {exc}") from None
    return run_profile(config, run_dir, user_command())


def _outputs(run_dir: Path) -> set[str]:
    """The run directory's own files (not Hydra's .hydra/ and job log, not the lock)."""
    return {
        p.name
        for p in run_dir.iterdir()
        if p.is_file() and not p.name.startswith(".") and p.suffix != ".log"
    }


def run_in(
    run_dir: Path,
    config: CbsimConfig,
    resolved: dict[str, Any],
    job: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the task in ``run_dir`` under its lock: skip it when a verified run of this very
    config is there, else clear an earlier run's files, run, and write the marker last."""
    with RunLock(run_dir):
        done = finished_metrics(run_dir, resolved)
        if done is not None:
            log.info("already finished in %s: skipped (resume)", run_dir)
            return done
        clear_run_outputs(run_dir)
        before = _outputs(run_dir)
        with interrupts_raise():
            metrics = run_task(config, resolved, run_dir)
        atomic_write_json(run_dir / METRICS_FILE, metrics)
        atomic_write_json(run_dir / JOB_CONFIG_FILE, resolved)
        write_finished(run_dir, resolved, _outputs(run_dir) - before | {METRICS_FILE}, job)
    return metrics


@hydra.main(version_base="1.3", config_path="pkg://cbsim.conf", config_name="config")
def hydra_job(cfg: DictConfig) -> dict[str, Any] | None:
    """One job: a single run, or one job of a sweep (its config already checked up front)."""
    hydra_cfg = HydraConfig.get()
    in_sweep = hydra_cfg.mode == RunMode.MULTIRUN
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        config = load_config(cfg)
        config.output = config.output.decided(in_sweep)
        job = (
            {"num": hydra_cfg.job.num, "overrides": list(hydra_cfg.overrides.task)}
            if in_sweep
            else None
        )
        metrics = run_in(run_dir, config, OmegaConf.to_container(cfg, resolve=True), job)
    except (ConfigError, RunDirError) as exc:
        if in_sweep:
            raise  # the job failed; the sweep reports it
        sys.exit(_fail(one_line(exc), 2))  # before Hydra adds its own "Error executing job"
    if not in_sweep:
        pages = [run_dir / p for p in (REPORT_FILE, *TASK_PAGES) if (run_dir / p).is_file()]
        print(f"cbsim: {'report' if pages else 'metrics'}: ", end="")
        print(pages[0] if pages else run_dir / METRICS_FILE)
    return metrics


# the page a task writes in place of the run report: the last line points to it
TASK_PAGES = ("capacity.html", "validation.html")


def one_line(exc: ConfigError | RunDirError) -> str:
    kind = "config error: " if isinstance(exc, ConfigError) else ""
    return f"cbsim: {kind}{exc}"


def _fail(message: str, code: int) -> int:
    print(message.replace("\n", " "), file=sys.stderr)
    return code


def main() -> int | None:
    """The command line through Hydra: errors as one line, exit 2; an interrupt as one line,
    exit 130 for SIGINT and 143 for SIGTERM (``--version``: cbsim/__main__.py)."""
    # Hydra raises instead of printing its own report, so the message below is the only one
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    try:
        from cbsim.profiling.select import rewrite

        USER_ARGS[:] = sys.argv[1:]
        sys.argv[1:] = rewrite(sys.argv[1:])  # hardware=<profile directory | auto>
        hydra_job()
    except (ConfigError, RunDirError) as exc:
        sys.exit(_fail(one_line(exc), 2))
    except (HydraException, OmegaConfBaseException) as exc:
        message = describe_hydra_error(exc)
        if message is None:
            raise
        sys.exit(_fail(f"cbsim: config error: {message}", 2))
    except KeyboardInterrupt as exc:
        sys.exit(_fail(f"cbsim: interrupted by {signal_name()}: {on_disk(exc)}", exit_code()))
    return None


def on_disk(exc: KeyboardInterrupt) -> str:
    """What an interrupted run left: its complete traces, the trace so far of the engine it
    stopped in, or nothing."""
    written = [str(p) for p in getattr(exc, "cbsim_written", [])]
    partial = getattr(exc, "cbsim_partial", None)
    kept = [f"complete trace{'s' * (len(written) > 1)} in {', '.join(written)}"] if written else []
    if partial:
        kept.append(f"the trace so far is in {partial} (incomplete)")
    return f"{'; '.join(kept) or 'no trace kept'}; not finished"
