"""``task=profile_machine``: one command measures the machine it runs on into one profile
directory (cbsim.profiling.profile_dir), in four steps inside a time budget:

1. the device's rates (runtime/device_rates.py): copy bandwidth, bf16 GEMM, pinned copies;
2. a kernel table per model named (runtime/profile_kernels.py, as +experiment=profile_kernels);
3. the probes (cbsim.profiling.probes): short runs of both engines, the host as it runs them;
4. the fit (cbsim.profiling.fit): host, copy and forward terms from the probes' spans.

The kernel tables carry over between GPUs; the host does not, so it is measured here rather than
fitted to another machine's recordings. ``extra.refit=DIR`` re-runs step 4 on a profile
directory's own probes, without a GPU.
"""

from __future__ import annotations

import dataclasses
import platform
import shlex
import shutil
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

from cbsim.calibration.calibrate import FitOptions
from cbsim.calibration.profile import CONF_HARDWARE
from cbsim.calibration.run_config import compose_overrides
from cbsim.config import CbsimConfig, ConfigError
from cbsim.config.schema import HardwareConfig
from cbsim.config.shipped_profiles import kernel_table_files
from cbsim.host import cpu_model, python_speed_us
from cbsim.profiling import profile_dir as pd
from cbsim.profiling.budget import Budget
from cbsim.profiling.fit import fit_profile
from cbsim.profiling.fresh import EAGER_PREFIX, add_fresh, run_fresh
from cbsim.profiling.options import ProfileOptions, read_options
from cbsim.profiling.probes import PROBES_DIR, check_probes, run_probes
from cbsim.profiling.profile_dir import KERNELS_DIR

# seconds each step is expected to take on an H100 with the 8B (extra.estimates_s overrides)
ESTIMATES_S = {"rates": 10.0, "kernels": 60.0, "probe_run": 5.0, "fresh_run": 25.0, "fit": 40.0}


def compose_group(group: str, name: str) -> dict[str, Any]:
    """One config group's option as composed (conf/<group>/<name>.yaml or a user profile)."""
    try:
        return compose_overrides([f"{group}={name}"], f"{group}={name}")[group]
    except ConfigError:
        options = sorted(
            p.stem for p in Path(str(resources.files("cbsim.conf") / group)).glob("*.yaml")
        )
        key = "models" if group == "model" else "base"
        raise ConfigError(
            f"extra.{key}: {name!r} is not a {group} config; allowed: {', '.join(options)}"
        ) from None


def base_hardware(config: CbsimConfig, opts: ProfileOptions) -> HardwareConfig:
    if opts.base is None:
        return config.hardware
    from omegaconf import OmegaConf

    raw = compose_group("hardware", opts.base)

    merged = OmegaConf.merge(OmegaConf.structured(HardwareConfig), raw)
    return OmegaConf.to_object(merged)  # type: ignore[return-value]


def profile_name(device_name: str) -> str:
    """A profile name from the GPU's name: "NVIDIA H100 80GB HBM3" -> "h100_80gb_hbm3"."""
    words = device_name.lower().replace("nvidia", " ").replace("-", " ").split()
    name = "_".join("".join(c for c in w if c.isalnum()) for w in words if w)
    return name or "this_machine"


def commit_of(opts: ProfileOptions) -> str:
    """The cbsim commit: git's, where this is a checkout, else extra.commit, else unknown."""
    here = Path(__file__).resolve().parent
    try:
        got = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if got.returncode == 0 and got.stdout.strip():
            dirty = subprocess.run(
                ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            return got.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return opts.commit or "unknown"


def host_facts() -> dict[str, Any]:
    """The host's CPU model, cores, memory (Linux /proc where it is there) and speed at the host
    phases' kind of Python work (cbsim.host.python_speed_us)."""
    import os

    cpu = cpu_model()
    ram = None
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        ram = pages * size
    except (OSError, ValueError, AttributeError):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_bytes": ram,
        "python_us": python_speed_us(),
        "python": platform.python_version(),
        "os": platform.platform(),
    }


def run_profile_machine(config: CbsimConfig, run_dir: Path, command: str) -> dict[str, Any]:
    opts = read_options(dict(config.extra))
    if opts.refit is not None:
        return refit(config, opts, command)
    if config.mode.name != "runtime":
        raise ConfigError("task=profile_machine measures the GPU it runs on; allowed: mode=runtime")
    out = Path(opts.out).expanduser().resolve()  # type: ignore[arg-type]
    if out.exists() and not (out / pd.MANIFEST).is_file():
        raise ConfigError(
            f"extra.out={opts.out} exists and is not a profile directory (no {pd.MANIFEST}); "
            "allowed: a new path, or a profile directory to replace"
        )
    models = {m: compose_group("model", m) for m in opts.models} or {
        config.model.name: dataclasses.asdict(config.model)
    }
    base = base_hardware(config, opts)
    if opts.kernel_tables is not None:
        kernel_table_files(opts.kernel_tables)  # a path without tables ends the command here
    if not config.mode.device.startswith("cuda"):
        opts = opts.on_cpu()
    check_probes(config, models[next(iter(models))], opts.probes)
    for name in list(models)[1:]:
        check_probes(config, models[name], opts.probes_of(name))
    est = {**ESTIMATES_S, **opts.estimates_s}
    budget = Budget(opts.max_minutes * 60.0)
    work = pd.start(out)
    try:
        result = _measure(config, opts, models, base, est, budget, work, command)
        pd.finish(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    budget.say(f"profile {result['profile']}: {out} ({budget.elapsed():.0f} s)")
    return {**result, "profile_dir": str(out), "hardware": str(out / result["hardware_yaml"])}


def _measure(config, opts, models, base, est, budget, work, command) -> dict[str, Any]:
    from cbsim.runtime.device_rates import measure_rates
    from cbsim.runtime.engine import check_device

    device = check_device(config, "sync")
    others = {m: opts.probes_of(m) for m in list(models)[1:]}
    runs = sum(p.repeat * 2 for p in [*opts.probes, *(p for ps in others.values() for p in ps)])
    fresh_s = est["fresh_run"] * (opts.fresh_runs + opts.fresh_eager_runs)
    tables = 0 if opts.kernel_tables else len(models)
    budget.ahead_s = est["rates"] + est["kernels"] * tables + est["probe_run"] * runs
    budget.ahead_s += fresh_s + est["fit"]
    small = device.type != "cuda"
    rates = budget.run("device rates", est["rates"], lambda: measure_rates(device, small)) or {}
    reserve = est["probe_run"] * runs + fresh_s + est["fit"]
    if opts.kernel_tables is None:
        _kernel_tables(config, opts, models, est["kernels"], reserve, budget, work, command)
    probes = _all_probes(
        config, opts, models, others, budget, work, est["probe_run"], fresh_s + est["fit"]
    )
    _fresh_runs(opts, command, work, budget, est)
    name = opts.name or profile_name(str(rates.get("device_name", "")))
    if (CONF_HARDWARE / f"{name}.yaml").exists():
        name += "_profiled"  # a shipped preset of that name would shadow it on the search path
    info = rates.pop("info", {})
    manifest = {
        "profile": name,
        "gpu": info,
        "host": host_facts(),
        "commit": commit_of(opts),
        "command": command,
        "models": list(models),
        "probe_model": next(iter(models)),
        "model_probes": {m: [p.name for p in ps] for m, ps in others.items() if ps},
        "base": base.name,
        "kernel_tables": opts.kernel_tables,
        "rates": rates,
        "noise": probes["noise"],
        "probe_runs": probes["runs"],
    }
    _probe_manifest(work, name, manifest)

    def fit(probes: bool = True):
        return fit_profile(work, base, rates, name, _fit_options(opts), probes, opts.kernel_tables)

    fitted = budget.run("fit", est["fit"], fit) or fit(probes=False)
    path = pd.write_hardware(work, fitted.hardware)
    manifest.update(
        fresh=fitted.fresh,
        notes=fitted.notes,
        fit=fitted.calibration.table().splitlines() if fitted.calibration else [],
        steps=budget.steps,
        seconds=round(budget.elapsed(), 1),
        budget_s=budget.seconds,
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    )
    pd.write_manifest(work, manifest)
    return {
        "task": "profile_machine",
        "profile": name,
        "hardware_yaml": str(path.relative_to(work)),
        "steps": budget.steps,
    }


def _all_probes(config, opts, models, others, budget, work, each_s, reserve_s) -> dict[str, Any]:
    """The probes of the first model, then the model_probes of every other."""
    first = next(iter(models))
    probes = run_probes(config, models[first], opts.probes, work, budget, each_s, reserve_s)
    for model, its_probes in others.items():
        if its_probes:
            more = run_probes(config, models[model], its_probes, work, budget, each_s, reserve_s)
            probes["runs"].update(more["runs"])
    return probes


def _fresh_runs(opts: ProfileOptions, command: str, work: Path, budget: Budget, est) -> None:
    """The fresh probe, then the fresh eager probe, again in separate processes, as a user
    runs them (cbsim.profiling.fresh)."""
    args = shlex.split(command)[3:]  # after "python -m cbsim"
    model = opts.models[0] if opts.models else None
    kinds = [
        (opts.fresh_probe, opts.fresh_runs, "run", opts.fresh_eager_runs),
        (opts.fresh_eager_probe, opts.fresh_eager_runs, EAGER_PREFIX, 0),
    ]
    for name, runs, prefix, later in kinds:
        probe = next((p for p in opts.probes if p.name == name), None)
        if probe is None or not runs:
            continue
        reserve = est["fit"] + est["fresh_run"] * later
        run_fresh(args, model, probe, work, runs, budget, est["fresh_run"], reserve, prefix)


def _kernel_tables(config, opts, models, each_s, reserve_s, budget, work, command) -> None:
    """A kernel table per model, each capped so the probes and the fit still fit the budget."""
    from cbsim.runtime.profile_kernels import run_profile

    for name, model in models.items():
        cap = min(float(opts.kernels.get("max_seconds", 150.0)), budget.left() - reserve_s)
        extra = {**opts.kernels, "out": str(work / KERNELS_DIR), "name": name, "max_seconds": cap}
        cfg = _with_model(config, model, extra)
        if cap < 5.0:
            budget.skip(f"kernel table {name}", "no time left before the probes (max_minutes)")
            continue
        budget.run(
            f"kernel table {name}", min(each_s, cap), lambda c=cfg: run_profile(c, work, command)
        )


def _with_model(config: CbsimConfig, model: dict[str, Any], extra: dict[str, Any]) -> CbsimConfig:
    from omegaconf import OmegaConf

    from cbsim.config.schema import ModelConfig

    obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), model))
    return dataclasses.replace(config, model=obj, extra=extra, task="profile_kernels")


def _fit_options(opts: ProfileOptions) -> FitOptions:
    return FitOptions(forward_samples=opts.forward_samples, starts=opts.starts, progress=True)


def _probe_manifest(work: Path, name: str, manifest: dict[str, Any]) -> None:
    """The probes as one recording session (cbsim/calibration/manifest.py): one stack, one call."""
    gpu = manifest["gpu"]
    pd.atomic_write_text(
        work / PROBES_DIR / "manifest.yaml",
        pd.yaml.safe_dump(
            pd.plain(
                {
                    "session": name,
                    "stack": name,
                    "call": name,
                    "recorded": time.strftime("%Y-%m-%d", time.gmtime()),
                    "commit": manifest["commit"],
                    "command": manifest["command"],
                    "hardware": f"{gpu.get('name', '')}, {manifest['host']['cpu']}",
                }
            ),
            sort_keys=False,
        ),
    )


def refit(config: CbsimConfig, opts: ProfileOptions, command: str) -> dict[str, Any]:
    """Step 4 again on a profile directory's probes and rates: its hardware yaml rewritten."""
    root = Path(opts.refit).expanduser().resolve()  # type: ignore[arg-type]
    if not (root / pd.MANIFEST).is_file():
        raise ConfigError(
            f"extra.refit={opts.refit}: no {pd.MANIFEST} there; allowed: a profile directory"
        )
    manifest = pd.read_manifest(root)
    name = opts.name or str(manifest.get("profile") or profile_name(""))
    base = base_hardware(config, dataclasses.replace(opts, base=opts.base or manifest.get("base")))
    rates = dict(manifest.get("rates") or {})
    given = opts.kernel_tables or manifest.get("kernel_tables")
    if given is not None:
        kernel_table_files(given)
    manifest["base"], manifest["kernel_tables"] = base.name, given
    for added in add_fresh(root, opts.fresh_from, str(rates.get("device_name") or "")):
        print(f"profile_machine: fresh runs added in {root / added}", file=sys.stderr)
    fitted = fit_profile(root, base, rates, name, _fit_options(opts), given_tables=given)
    path = pd.write_hardware(root, fitted.hardware)
    if fitted.fresh is not None:
        manifest["fresh"] = fitted.fresh
    manifest["notes"] = fitted.notes
    manifest["fit"] = fitted.calibration.table().splitlines() if fitted.calibration else []
    manifest.setdefault("refits", []).append({"command": command, "commit": commit_of(opts)})
    pd.write_manifest(root, manifest)
    print(f"profile_machine: refitted {path}", file=sys.stderr)
    return {"task": "profile_machine", "profile": name, "hardware": str(path), "refit": True}
