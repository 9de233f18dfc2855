"""The ``task=calibrate`` and ``task=validate`` entry points called by cbsim.app.

Settings under ``extra`` (conf/experiment/calibrate.yaml and validate.yaml document them):

calibrate: ``profile`` (name of the profile written, default ``<hardware.name>_calibrated``),
``install`` (also write it to the package's conf/hardware/ so ``hardware=<profile>`` selects it).

validate: ``holdout``: ``workload`` (default), ``engine`` or ``run`` (``loo``): each run predicted by a
profile fitted on the other runs of its recording session (all sessions when ``by_session`` is
false) less every run of its workload, of its engine, or only itself (validate.leave_out),
``fit_on`` (a fixed calibration set, paths or globs: runs in it are reported in-sample, the others
held out) or ``profile`` (the composed ``hardware`` as it is, e.g. ``hardware=h200_calibrated``;
runs named in that profile's ``source`` are reported in-sample). ``report`` (default true):
write validation.html.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from cbsim.config import CbsimConfig, ConfigError
from cbsim.trace import write_trace
from cbsim.validation.calibrate import calibrate
from cbsim.validation.profile import write_profile
from cbsim.validation.traces import Recorded, label, load, resolve_traces
from cbsim.validation.validate import (
    LEAVE_OUT,
    error_table,
    leave_out,
    summary,
    validate_run,
)

log = logging.getLogger("cbsim")
# run / workload / engine: leave that out of each run's profile (validate.leave_out); loo = run
HOLDOUTS = (*LEAVE_OUT, "loo", "fit_on", "profile")


def run_validation_task(
    config: CbsimConfig, resolved: dict[str, Any], run_dir: Path
) -> dict[str, Any]:
    run_dir = Path(run_dir)
    if not config.trace:
        raise ConfigError(
            f"task={config.task} needs traces: trace=[path,...] (paths or globs; "
            "+experiment=calibrate / validate set the recorded ones)"
        )
    recs = runtime_traces(load(resolve_traces(list(config.trace))))
    if config.task == "calibrate":
        return run_calibrate(config, recs, run_dir)
    return run_validate(config, recs, run_dir)


def runtime_traces(recs: list[Recorded]) -> list[Recorded]:
    """Traces that can be re-simulated: with a run config, from the runtime (or the simulator,
    for self-checks); imported profiler traces have no config."""
    keep = [
        r
        for r in recs
        if r.trace.source in ("runtime", "sim")
        and ("config" in r.trace.other_data or "config_overrides" in r.trace.other_data)
        and "_partial" not in r.path.name
    ]
    for r in recs:
        if r not in keep:
            log.warning("skipped %s: source %r without otherData.config", r.path, r.trace.source)
    if not keep:
        raise ConfigError(
            "none of the traces carries a run config (otherData.config); pass "
            "traces written by python -m cbsim (mode=runtime)"
        )
    return keep


def run_calibrate(config: CbsimConfig, recs: list[Recorded], run_dir: Path) -> dict[str, Any]:
    extra = config.extra
    name = str(extra.get("profile") or f"{config.hardware.name}_calibrated")
    sessions = sorted({r.session for r in recs})
    if len(sessions) > 1:
        log.warning(
            "the traces come from %d recording sessions (%s): one profile over runtime "
            "versions that cost differently; fit one session with "
            "trace=[experiments/runtime/<session>/**/trace_*.json.gz]",
            len(sessions),
            ", ".join(sessions),
        )
    cal = calibrate(recs, config.hardware, name)
    paths = write_profile(cal, config.hardware.name, run_dir, bool(extra.get("install", False)))
    (run_dir / "calibration.json").write_text(json.dumps(cal.as_dict(), indent=2, default=float))
    if config.output.print_table:
        print(f"calibrated {name} on {len(recs)} trace(s); residuals (predicted vs recorded):")
        print(cal.table())
        print("profile: " + ", ".join(str(p) for p in paths))
    return {
        "task": "calibrate",
        "profile": name,
        "profile_paths": [str(p) for p in paths],
        **cal.as_dict(),
    }


def run_validate(config: CbsimConfig, recs: list[Recorded], run_dir: Path) -> dict[str, Any]:
    extra = config.extra
    holdout = str(extra.get("holdout", "workload"))
    if holdout not in HOLDOUTS:
        raise ConfigError(f"extra.holdout={holdout!r}; allowed: {', '.join(HOLDOUTS)}")
    fit_on_patterns = list(extra.get("fit_on") or [])
    name = f"{config.hardware.name}_calibrated"
    if holdout == "loo":
        holdout = "run"
    if holdout in LEAVE_OUT and len(recs) < 2:
        log.warning(
            "one trace: nothing to hold out; validating with hardware=%s as it is",
            config.hardware.name,
        )
        holdout = "profile"
    if holdout in LEAVE_OUT:
        by_session = bool(extra.get("by_session", True))
        results, _ = leave_out(recs, config.hardware, name, holdout, by_session)
    elif holdout == "fit_on":
        if not fit_on_patterns:
            raise ConfigError("extra.holdout=fit_on needs extra.fit_on=[path,...]")
        fit_recs = runtime_traces(load(resolve_traces(fit_on_patterns)))
        cal = calibrate(fit_recs, config.hardware, name)
        fitted = {r.path.resolve() for r in fit_recs}
        names = [r.name for r in fit_recs]
        results = [
            validate_run(r, cal.hardware, r.path.resolve() not in fitted, names) for r in recs
        ]
        for r in results:
            r.fit_table = cal.table()
            r.held_out_by = "fit_on" if r.held_out else ""
    else:
        source = config.hardware.source
        results = [validate_run(r, config.hardware, label(r.path) not in source, []) for r in recs]
        for r in results:
            r.held_out_by = "profile" if r.held_out else ""
    out = {
        "task": "validate",
        "holdout": holdout,
        "hardware_base": config.hardware.name,
        "summary": summary(results),
        "runs": [r.as_dict() for r in results],
    }
    (run_dir / "validation.json").write_text(json.dumps(out, indent=2, default=float))
    if extra.get("save_sim_traces", False):
        for r in results:
            write_trace(r.sim_trace, run_dir / f"sim_{r.rec.name.replace('/', '_')}.json.gz")
    if extra.get("report", True):
        from cbsim.validation.report import write_validation_report

        write_validation_report(results, out, run_dir / "validation.html")
    if config.output.print_table:
        print(f"validation ({holdout}): error of the simulator vs the recorded run")
        print(error_table(results))
        s = out["summary"]
        print(
            f"targets on held-out runs: total {s['targets']['total_time_pct']}%, idle "
            f"{s['targets']['gpu_idle_pp']} pp, step p50 {s['targets']['step_p50_pct']}% -> "
            f"{s['held_out_within_target']} of {s['held_out_runs']} held-out runs within"
        )
    return out
