"""The ``task=calibrate`` and ``task=validate`` entry points called by cbsim.app.

Each task declares the ``extra`` keys it reads (``EXTRA_KEYS``; conf/experiment/calibrate.yaml
and validate.yaml set them, docs/validation.md explains them); the app refuses any other.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from cbsim.calibration.calibrate import Calibration, FitOptions, calibrate
from cbsim.calibration.imported import assume_cli_config, has_run_config
from cbsim.calibration.predict import import_check, predict_speedup, prediction_lines
from cbsim.calibration.profile import write_profile
from cbsim.calibration.recordings import (
    Recorded,
    describe_root,
    label,
    load,
    recordings_root,
    resolve_traces,
)
from cbsim.config import CbsimConfig, ConfigError
from cbsim.config.model_error import METRICS
from cbsim.rundir import atomic_write_text
from cbsim.trace import write_trace
from cbsim.trace.hardware import recorded_device
from cbsim.validation.anchor import DEFAULT_ANCHOR, HOST_MODELS, anchored_results
from cbsim.validation.banding import attach_bands
from cbsim.validation.heap import collector_paused, long_lived
from cbsim.validation.holdout import LEAVE_OUT, leave_out
from cbsim.validation.host_level import at_recorded_hosts, host_level_choice, host_level_line
from cbsim.validation.host_phases import host_phase_lines, host_phase_summary
from cbsim.validation.judge import judge, profile_scope
from cbsim.validation.judged_text import check_lines, judged_table
from cbsim.validation.model_error import MODEL_ERRORS, held_out_model_error
from cbsim.validation.report import write_validation_report
from cbsim.validation.runs import RunResult, error_table, validate_run, validate_runs
from cbsim.validation.speedup import speedup_table, speedups
from cbsim.validation.summary import summary
from cbsim.validation.targets import targets_from, targets_source

log = logging.getLogger("cbsim")

_SHARED = {
    "recordings": "the recordings directory (absolute, or relative to the working directory; "
    "left at experiments/recordings where there is none, the compact set shipped with cbsim); "
    "relative trace paths are tried against it after the working directory",
    "forward_samples": "forward spans used per trace by the forward fit (8 or more)",
    "starts": "starts of the forward fit, the best kept (1, 2 or 3)",
    "progress": "show a progress bar with an ETA on stderr",
}
# task -> the extra keys it accepts, each with what it does
EXTRA_KEYS: dict[str, dict[str, str]] = {
    "calibrate": {
        **_SHARED,
        "profile": "name of the profile written (default <hardware.name>_calibrated)",
        "install": "also install it into the user config directory ($CBSIM_CONFIG_DIR, else "
        "~/.config/cbsim), where hardware=<profile> finds it",
        "workload_from_cli": "a trace without a run config (a Kineto import) ran the command "
        "line's model, workload and engine: calibrate on it and predict the async speedup",
        "uneven": "measure gpu.decode_uneven_share over the async runs after the forward fit",
        "model_error": "call (the held-out error of each device call predicted from a profile "
        "fitted on the others, written as model_error) | none",
        "jobs": "model_error=call: worker processes for its fits (0: one per CPU)",
    },
    "validate": {
        **_SHARED,
        "holdout": "what each run's profile has not seen: workload, engine, model, call, run "
        "(loo), or fit_on (a fixed set) | profile (hardware as composed) | anchored (hardware "
        "as composed, moved to each call's machine by that call's reference runs)",
        "anchor": "holdout=anchored: the reference workload's case name (default "
        f"{DEFAULT_ANCHOR})",
        "anchor_host": "holdout=anchored: how the reference's sync run moves the host: factor "
        "(every host cost times one factor) or wake (microseconds more per wake-up)",
        "same_stack": "fit on runs of the held-out run's stack only (one runtime version)",
        "same_call": "fit on runs of the held-out run's device call only (one host's speed)",
        "fit_on": "holdout=fit_on: the calibration set (paths or globs)",
        "jobs": "worker processes for the fits, the runs' simulations and the bands' draws "
        "(0: one per CPU)",
        "host_level": "holdout=profile: recorded (each run predicted for the host it read at "
        "start, hardware.host.level) or profile (the profile's own host)",
        "bands": "draw P5-P95 bands from the profile's host-speed spread and say whether each "
        "recording lies inside: true, false, or auto (when a run is predicted from other calls)",
        "report": "write validation.html",
        "save_sim_traces": "also write each simulated trace",
        "targets": "what the held-out workloads (repeats grouped, judged against their mean) "
        "are judged against: a mapping of cbsim.validation.targets.Targets' fields and a "
        "source line (conf/experiment/judge.yaml)",
    },
}
HOLDOUTS = (*LEAVE_OUT, "loo", "fit_on", "profile", "anchored")


def run_validation_task(
    config: CbsimConfig, resolved: dict[str, Any], run_dir: Path
) -> dict[str, Any]:
    run_dir = Path(run_dir)
    if not config.trace:
        raise ConfigError(
            f"task={config.task} needs traces: trace=[path,...] (paths or globs; "
            "+experiment=calibrate / validate set the recorded ones)"
        )
    root = recordings_root(config.extra.get("recordings"))
    log.info(describe_root(root))
    with collector_paused():
        recs = load(resolve_traces(list(config.trace), root), root)
    assumed = []
    if config.task == "calibrate" and config.extra.get("workload_from_cli", False):
        assumed = assume_cli_config(recs, config)
    recs = runtime_traces(recs)
    with long_lived():
        if config.task == "calibrate":
            return run_calibrate(config, recs, run_dir, assumed)
        return run_validate(config, recs, run_dir, root)


def write_json(path: Path, obj: Any) -> None:
    """Indented JSON, numpy scalars as numbers, written atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, default=_number) + "\n")


def _number(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")


def fit_options(extra: dict[str, Any]) -> FitOptions:
    defaults = FitOptions()
    try:
        return FitOptions(
            forward_samples=int(extra.get("forward_samples", defaults.forward_samples)),
            starts=int(extra.get("starts", defaults.starts)),
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"extra.{exc}") from None


def runtime_traces(recs: list[Recorded]) -> list[Recorded]:
    """Traces that can be re-simulated: with a run config, from the runtime (or the simulator,
    for self-checks); imported profiler traces have no config."""
    keep = [
        r
        for r in recs
        if r.imported
        or (
            r.trace.source in ("runtime", "sim")
            and has_run_config(r)
            and "_partial" not in r.path.name
        )
    ]
    for r in recs:
        if r not in keep:
            log.warning("skipped %s: source %r without otherData.config", r.path, r.trace.source)
    if not keep:
        raise ConfigError(
            "none of the traces carries a run config (otherData.config); pass "
            "traces written by python -m cbsim (mode=runtime), or (calibrate, a Kineto import) "
            "give the model, workload and engine it ran and extra.workload_from_cli=true"
        )
    return keep


def run_calibrate(
    config: CbsimConfig, recs: list[Recorded], run_dir: Path, assumed: list[str] | None = None
) -> dict[str, Any]:
    extra = config.extra
    name = str(extra.get("profile") or f"{config.hardware.name}_calibrated")
    stacks = sorted({r.stack for r in recs})
    if len(stacks) > 1:
        log.warning(
            "the traces come from %d stacks (%s): one profile over runtime versions that cost "
            "differently; fit one with trace=[<session>/**/trace_*.json.gz]",
            len(stacks),
            ", ".join(stacks),
        )
    if any(r.imported for r in recs) and not all(r.imported for r in recs):
        log.warning(
            "a profiler import calibrated with recorded runtime traces: one profile over two "
            "engines (the import's kernel counts and host time apply to both)"
        )
    show = bool(extra.get("progress", True))
    options = dataclasses.replace(
        fit_options(extra), progress=show, uneven=bool(extra.get("uneven", False))
    )
    cal = calibrate(recs, config.hardware, name, options)
    measure_model_error(cal, recs, config, options, show)
    table = cal.table()
    cal.notes[:0] = assumed or []  # in calibration.json and the profile's header
    paths = write_profile(cal, config.hardware.name, run_dir, bool(extra.get("install", False)))
    out = {"task": "calibrate", "profile": name, "profile_paths": [str(p) for p in paths]}
    lines = []
    if any(r.imported for r in recs):
        checks = [import_check(r, cal.hardware) for r in recs if r.imported]
        out["imports"], out["prediction"] = checks, predict_speedup(config, cal.hardware)
        lines = prediction_lines(out["prediction"], checks)
    write_json(run_dir / "calibration.json", {**cal.as_dict(), **out})
    if config.output.print_table:
        head = f"calibrated {name} on {len(recs)} trace(s); residuals (predicted vs recorded):"
        print("\n".join([*(assumed or []), head, table, *lines]))
        print("profile: " + ", ".join(str(p) for p in paths))
    return {**out, **cal.as_dict()}


def measure_model_error(
    cal: Calibration, recs: list[Recorded], config: CbsimConfig, options, show: bool
) -> None:
    """extra.model_error=call: the profile's model_error from its calibration set's calls."""
    how = str(config.extra.get("model_error", "none"))
    if how not in MODEL_ERRORS:
        raise ConfigError(f"extra.model_error={how!r}; allowed: {', '.join(MODEL_ERRORS)}")
    if how == "none":
        return
    jobs = int(config.extra.get("jobs", 0))
    got = held_out_model_error(recs, config.hardware, cal.hardware.name, options, jobs, show)
    if got is None:
        cal.notes.append("model_error kept: the traces come from one device call")
        return
    cal.hardware.model_error, text = got
    for metric in METRICS:
        cal.provenance[f"model_error.{metric}"] = text


def held_out_results(
    config: CbsimConfig, recs: list[Recorded], holdout: str, root: Path
) -> list[RunResult]:
    """Each run simulated with the profile the holdout gives it."""
    extra, name = config.extra, f"{config.hardware.name}_calibrated"
    options = fit_options(extra)
    if holdout in LEAVE_OUT:
        same_stack = bool(extra.get("same_stack", True))
        same_call = bool(extra.get("same_call", False))
        jobs, show = int(extra.get("jobs", 0)), bool(extra.get("progress", True))
        args = (holdout, same_stack, options, jobs, show, same_call)
        return leave_out(recs, config.hardware, name, *args)[0]
    if holdout == "anchored":
        host_model = str(extra.get("anchor_host", "factor"))
        if host_model not in HOST_MODELS:
            raise ConfigError(
                f"extra.anchor_host={host_model!r}; allowed: {', '.join(HOST_MODELS)}"
            )
        anchor = str(extra.get("anchor", DEFAULT_ANCHOR))
        return anchored_results(recs, config.hardware, anchor, host_model)
    if holdout == "fit_on":
        patterns = list(extra.get("fit_on") or [])
        if not patterns:
            raise ConfigError("extra.holdout=fit_on needs extra.fit_on=[path,...]")
        fit_recs = runtime_traces(load(resolve_traces(patterns, root), root))
        cal = calibrate(fit_recs, config.hardware, name, options)
        fitted = {r.path.resolve() for r in fit_recs}
        names = [r.name for r in fit_recs]
        results = [
            validate_run(r, cal.hardware, r.path.resolve() not in fitted, names) for r in recs
        ]
        for r in results:
            r.fit_table = cal.table()
            r.held_out_by = "fit_on" if r.held_out else ""
            r.across_calls = r.rec.call not in {f.call for f in fit_recs}
        return results
    source, hw = config.hardware.source, config.hardware
    hosts = [hw] * len(recs)
    if host_level_choice(extra.get("host_level", "recorded")) == "recorded":
        hosts = at_recorded_hosts(recs, hw)
        line = host_level_line(hosts, hw)
        if line:
            log.info(line)
    held = [label(r.path, r.root) not in source for r in recs]
    results = validate_runs(recs, hosts, held, int(extra.get("jobs", 0)))
    for r in results:
        r.held_out_by = "profile" if r.held_out else ""
    return results


def chosen_holdout(extra: dict[str, Any], recs: list[Recorded]) -> str:
    holdout = str(extra.get("holdout", "workload"))
    if holdout not in HOLDOUTS:
        raise ConfigError(f"extra.holdout={holdout!r}; allowed: {', '.join(HOLDOUTS)}")
    holdout = "run" if holdout == "loo" else holdout
    if holdout in LEAVE_OUT and len(recs) < 2:
        log.warning("one trace: nothing to hold out; validating with the composed hardware")
        return "profile"
    return holdout


def wants_bands(extra: dict[str, Any], holdout: str, results: list[RunResult]) -> bool:
    value = extra.get("bands", "auto")
    if value not in (True, False, "auto"):
        raise ConfigError(f"extra.bands={value!r}; allowed: true, false, auto")
    judged = holdout == "profile" and extra.get("targets") is not None
    if value is False or (
        value == "auto" and not judged and not any(r.across_calls for r in results)
    ):
        return False
    spread = [r.hardware.host.spread for r in results if r.hardware is not None]
    if not any(s.between_calls or s.within_run for s in spread):
        log.warning("no bands: the profile carries no host-speed spread (hardware.host.spread)")
        return False
    return True


def scope_of(config: CbsimConfig, recs: list[Recorded]) -> str:
    """What the composed profile is to these recordings (judge.profile_scope)."""
    devices = [recorded_device(r.trace.other_data) for r in recs]
    return profile_scope(config.hardware.tier, config.hardware.device_name, devices)


def run_validate(
    config: CbsimConfig, recs: list[Recorded], run_dir: Path, root: Path
) -> dict[str, Any]:
    extra = config.extra
    holdout = chosen_holdout(extra, recs)
    targets = extra.get("targets")
    judging = targets_from(targets)  # a wrong target ends the run before any simulation
    results = held_out_results(config, recs, holdout, root)
    pairs = speedups(results)
    if wants_bands(extra, holdout, results):
        attach_bands(results, pairs, bool(extra.get("progress", True)), int(extra.get("jobs", 0)))
    out = {
        "task": "validate",
        "holdout": holdout,
        "hardware_base": config.hardware.name,
        "recordings": str(root),
        "judged": judge(pairs, judging, targets_source(targets), scope_of(config, recs)),
        "summary": summary(results, pairs),
        "host_phases": host_phase_summary(results),
        "speedups": [p.as_dict() for p in pairs],
        "runs": [r.as_dict() for r in results],
    }
    write_json(run_dir / "validation.json", out)
    if extra.get("save_sim_traces", False):
        for r in results:
            write_trace(r.sim_trace, run_dir / f"sim_{r.rec.name.replace('/', '_')}.json.gz")
    if extra.get("report", True):
        write_validation_report(results, pairs, out, run_dir / "validation.html")
    if config.output.print_table:
        if out["judged"]:
            print(f"async speedup per workload ({holdout}), predicted vs the recorded mean:")
            print(judged_table(out["judged"]))
            print("\n".join(check_lines(out["judged"])))
        print_tables(holdout, results, pairs, out["summary"])
        print("\n".join(host_phase_lines(out["host_phases"])))
    return out


def print_tables(holdout: str, results: list[RunResult], pairs: list, s: dict[str, Any]) -> None:
    held = "held out" if holdout not in ("profile", "fit_on") else "with the given profile"
    if pairs:
        print(f"async speedup per workload ({holdout}), recorded vs predicted:")
        print(speedup_table(pairs))
        sp = s["speedup"]
        print(
            f"{sp['within_target']} of {sp['workloads']} held-out workloads within "
            f"{sp['target_points']:g} point"
        )
    print(f"validation ({holdout}): error of the simulator vs the recorded run ({held})")
    print(error_table(results))
    t = s["targets"]
    print(
        f"targets on held-out runs: total {t['total_time_pct']}%, idle {t['gpu_idle_pp']} pp, "
        f"step p50 {t['step_p50_pct']}% -> {s['held_out_within_target']} of "
        f"{s['held_out_runs']} held-out runs within"
    )
    if s.get("bands"):
        b = s["bands"]
        print(
            f"bands: {b['coverage']:.0%} of {b['runs']} held-out runs inside P5-P95; median "
            f"idle half-width {b['idle_half_width_pp_median']:.2f} pp"
        )
        if b.get("model_error_for_coverage"):
            need = ", ".join(f"{k} {v:.3g}" for k, v in b["model_error_for_coverage"].items())
            print(f"  hardware.model_error that would hold 90% of them inside: {need}")
