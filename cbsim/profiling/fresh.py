"""The host's level as users meet it: the reference probe run again as separate
``python -m cbsim mode=runtime engine=compare`` processes, each measured against the fitted
profile.

The probes run in one process that built the model once; a user's run is a process of its own.
Host costs seen by separate processes of one machine differ from run to run by up to 2-3x
(recorded reference workloads of one device call: schedule 10-31 us a step), so the level the
probes measured is one draw. Each fresh run gives one host factor, its host phases (schedule,
prepare, update; both engines) over the simulated run's: measured where the host works, not
back-fitted to the sync total, where the forwards are most of the time and a 1% forward error
moved the host level by a third (the H100 profile: x0.497 anchored, x0.593 measured). Its forward
factor is the async decode time's over the simulated one's (cbsim/validation/anchor.py). The
profile takes their medians as its host and forward levels, and the spread of the host factors'
logs as ``host.spread.between_calls``. Their traces stay in the profile directory (``fresh/``),
so ``extra.refit`` measures the same.

An eager launch (every kernel launched from Python, no graph) keeps a level of its own: on
the H100 profile's machine the fresh runs ran the host phases at x0.59 of the probes' fit and
their eager launches at x1.21-1.45 of it, so the profile's eager launch costs (``EAGER_LAUNCH_COSTS``) take
the median of the fresh runs' eager launch factors, their recorded eager launches over the
simulated ones: the reference runs' eager steps, and runs of the eager probe (no CUDA graphs,
``extra.fresh_eager_probe``, ``fresh/eager_<i>``), which give that factor only.

One machine's processes are not every machine's: hosts of one cloud GPU sit at different levels
(the H100's held-out machines: median host factors x0.97 to x2.45). Fresh runs recorded on other
machines of the same GPU join the profile through ``extra.fresh_from`` (``add_fresh``), each
machine's in ``fresh/gpu-<uuid>/``, so the median and the spread are over machines too.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from cbsim.bands import host_times_scaled
from cbsim.calibration.recordings import load
from cbsim.calibration.simulated import simulate_like
from cbsim.config.errors import ConfigError
from cbsim.config.hardware import HostCosts
from cbsim.config.schema import HardwareConfig
from cbsim.profiling.budget import Budget
from cbsim.profiling.eager_exponent import fit_eager_exponent
from cbsim.profiling.options import Probe
from cbsim.trace import Trace, TraceError, read_trace
from cbsim.trace import schema as S
from cbsim.trace.hardware import hardware_of
from cbsim.validation.anchor import FACTOR_RANGE, CallMachine, measure_call
from cbsim.validation.tasks import runtime_traces

FRESH_DIR = "fresh"
# the command-line keys a fresh run takes from the user's command: what chooses the machine
# and the runtime (mode.*, engine.*), not what belongs to the profile command or its outputs
PASSED = ("mode.", "engine.", "model=", "model.")
HOST_PHASES = ("schedule", "prepare", "update")
# the costs of an eager launch, which take the fresh runs' eager launch level where they have one
EAGER_LAUNCH_COSTS = ("kernel_launch_us", "eager_forward_us")
# fresh runs of the eager probe (fresh/eager_<i>, no CUDA graphs): the eager launch level only
EAGER_PREFIX = "eager"


def fresh_command(args: list[str], model: str | None, probe: Probe, folder: Path) -> list[str]:
    """``python -m cbsim`` for one fresh run: the user's mode and engine keys, the probe's
    values, both engines, its trace into ``folder``."""
    kept = [a for a in args if a.lstrip("+~").startswith(PASSED)]
    if model is not None:  # the probes' model is that preset as it is, so the fresh runs' too
        kept = [a for a in kept if not a.lstrip("+~").startswith("model")] + [f"model={model}"]
    values = [f"{k}={_value(v)}" for k, v in probe.values.items()]
    outputs = [
        "output.trace=true",
        "output.trace_gzip=true",
        "output.report=false",
        "output.print_table=false",
        f"hydra.run.dir='{folder}'",
    ]
    cuda = not any(a.startswith("mode.device=") and "cuda" not in a for a in kept)
    engine = "engine=compare" if cuda else "engine=sync"
    return [sys.executable, "-m", "cbsim", "mode=runtime", *kept, *values, engine, *outputs]


def _value(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def run_fresh(
    args: list[str],
    model: str | None,
    probe: Probe,
    out: Path,
    runs: int,
    budget: Budget,
    each_s: float,
    reserve_s: float,
    prefix: str = "run",
) -> int:
    """``runs`` fresh processes of ``probe`` into out/fresh/<prefix>_<i>; returns how many ran."""
    done = 0
    for i in range(1, runs + 1):
        folder = out / FRESH_DIR / f"{prefix}_{i}"
        cmd = fresh_command(args, model, probe, folder)

        def once(cmd: list[str] = cmd) -> bool:
            limit = max(120.0, 4 * each_s)
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=limit)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"no end after {limit:.0f} s") from None
            if r.returncode != 0:
                tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [""]
                raise RuntimeError(f"exit {r.returncode}: {tail[0]}")
            return True

        budget.ahead_s = each_s * (runs - i) + reserve_s
        if budget.run(f"fresh run {i} of {probe.name}", each_s, once, reserve_s):
            done += 1
    return done


@dataclasses.dataclass(frozen=True)
class FreshLevel:
    """The fresh runs against a profile: one CallMachine each, their median host factor and
    the standard deviation of the factors' logs (0 with fewer than two)."""

    machines: dict[str, CallMachine]
    host: float
    between_calls: float
    forward: float = 1.0
    # the median of the runs' host readings at start (cbsim/host.py; 0: none recorded)
    python_us: float = 0.0
    # run -> its eager launches' factor (recorded over simulated), for runs with any; their
    # median is the level of the eager launch costs (none: they take the host factor)
    eager_runs: dict[str, float] = dataclasses.field(default_factory=dict)
    # run -> its host reading at start, for every run that has one (eager-only runs too)
    readings: dict[str, float] = dataclasses.field(default_factory=dict)

    @functools.cached_property
    def eager_fit(self) -> tuple[float | None, str]:
        """The exponent by which the eager launches follow the readings, and what it rests on
        (or None, and why not): cbsim/profiling/eager_exponent.py."""
        return fit_eager_exponent(self.readings, self.eager_runs, self.python_us)

    @property
    def eager(self) -> float | None:
        return statistics.median(self.eager_runs.values()) if self.eager_runs else None


def fresh_level(out: Path, hw: HardwareConfig) -> FreshLevel | None:
    """The host level of out/fresh's runs against ``hw``; None without fresh runs."""
    paths = sorted((out / FRESH_DIR).glob("**/trace*.json.gz"))
    if not paths:
        return None
    by_run: dict[str, dict[str, Any]] = {}
    for r in runtime_traces(load(paths, out / FRESH_DIR)):  # run_<i> or gpu-<uuid>/run_<i>
        by_run.setdefault(str(Path(r.name).parent), {})[r.engine] = r
    machines, readings, eager, eager_only = {}, {}, {}, set()
    for run, engines in sorted(by_run.items()):
        sync = engines.get("sync")
        if sync is None:
            continue
        async_ = engines.get("async")
        runs = [r for r in (sync, async_) if r is not None]
        sims = [simulate_like(r, hw) for r in runs]  # each run simulated once, for both factors
        eager_factors = [f for f in map(eager_factor, runs, sims) if f is not None]
        if eager_factors:
            eager[run] = math.exp(statistics.fmean(math.log(f) for f in eager_factors))
        if sync.host_python_us:
            readings[run] = sync.host_python_us
        if Path(run).name.startswith(EAGER_PREFIX):
            eager_only.add(run)  # its host phases and forwards are not the graphed ones'
            continue
        host = math.exp(statistics.fmean(math.log(f) for f in map(phase_factor, runs, sims)))
        try:
            # a CPU smoke run records sync only: its forward is taken as profiled
            forward = measure_call(sync, async_, hw, "none").forward if async_ else 1.0
        except ConfigError:  # a factor outside anchor.FACTOR_RANGE: not a probe of this host
            continue
        machine = CallMachine(forward, host=host)
        if FACTOR_RANGE[0] <= machine.host <= FACTOR_RANGE[1]:
            machines[run] = machine
    if not machines:
        return None
    logs = [math.log(m.host) for m in machines.values()]
    spread = statistics.stdev(logs) if len(logs) > 1 else 0.0
    host = statistics.median(m.host for m in machines.values())
    forward = statistics.median(m.forward for m in machines.values())
    known = [readings[run] for run in machines if run in readings]
    python_us = round(statistics.median(known), 1) if len(known) == len(machines) else 0.0
    eager = {run: f for run, f in eager.items() if run in machines or run in eager_only}
    return FreshLevel(machines, host, spread, forward, python_us, eager, readings)


def phase_factor(rec, sim: Trace) -> float:
    """A run's host factor: its schedule, prepare and update time over its simulation's."""

    def phases(trace: Trace) -> float:
        sp = trace.spans
        return float(sp[sp.name.isin(HOST_PHASES)].dur.sum())

    simulated, real = phases(sim), phases(rec.trace)
    return real / simulated if simulated > 0 and real > 0 else 1.0


def eager_factor(rec, sim: Trace) -> float | None:
    """A run's eager launches (steps whose forward ran without a graph): their recorded time
    over its simulation's; None where it has none."""

    def eager_launch_us(trace: Trace) -> float:
        sp = trace.spans
        eager_steps = sp.loc[sp.name == S.FORWARD, "step"]
        launches = sp[(sp.lane == S.HOST) & (sp.name == S.LAUNCH) & sp.step.isin(eager_steps)]
        return float(launches.dur.sum())

    real, simulated = eager_launch_us(rec.trace), eager_launch_us(sim)
    return real / simulated if real > 0 and simulated > 0 else None


def apply_level(hw: HardwareConfig, level: FreshLevel, prov: dict[str, str]) -> HardwareConfig:
    """``hw`` with every host cost times the fresh runs' median factor (the eager launch costs
    times their median eager launch factor, where any run launched eagerly) and their median
    host reading as the one the costs hold at, every forward times their median forward factor
    (separate processes' forwards ran 3-6% slower than one process's probes: the H100's and
    the H200's recorded reference runs), and their spread as ``host.spread.between_calls``;
    provenance says so."""
    host = host_times_scaled(hw.host, level.host)
    n = len(level.machines)
    eager = level.eager
    if eager is not None:  # the eager launch costs at their own level (the module docstring)
        host = dataclasses.replace(
            host, **{k: eager * getattr(hw.host, k) for k in EAGER_LAUNCH_COSTS}
        )
    scale = round(hw.gpu.spread.forward_scale * level.forward, 4)
    spread_gpu = dataclasses.replace(hw.gpu.spread, forward_scale=scale)
    hw = dataclasses.replace(hw, gpu=dataclasses.replace(hw.gpu, spread=spread_gpu))
    prov["gpu.spread.forward_scale"] = (
        f"measured: x{level.forward:.3f}, the median forward factor of {n} fresh runs ({FRESH_DIR}/)"
    )
    note = f"x{level.host:.3f}, the median host factor of {n} fresh runs ({FRESH_DIR}/)"
    eager_note = (
        f"x{eager:.3f}, the median eager launch factor of {len(level.eager_runs)} fresh runs "
        f"({FRESH_DIR}/)"
        if eager is not None
        else None
    )
    for key in prov:
        if key.startswith("host.") and not key.startswith(("host.spread.", "host.level.")):
            own = eager_note if eager_note and key[len("host.") :] in EAGER_LAUNCH_COSTS else None
            prov[key] = f"{prov[key]}; times {own or note}"
    host = dataclasses.replace(
        host, level=dataclasses.replace(host.level, python_us=level.python_us)
    )
    host = with_eager_exponent(host, level, prov)
    prov["host.level.python_us"] = (
        f"measured: the median start-of-run host_python_us of {n} fresh runs ({FRESH_DIR}/), "
        "the host the costs now hold on"
        if level.python_us
        else f"kept at 0 (not known): the {n} fresh runs carry no host reading"
    )
    if n > 1:
        spread = dataclasses.replace(host.spread, between_calls=round(level.between_calls, 4))
        host = dataclasses.replace(host, spread=spread)
        prov["host.spread.between_calls"] = (
            f"measured: std of log host factor over {n} fresh runs ({FRESH_DIR}/)"
        )
    return dataclasses.replace(hw, host=host)


def with_eager_exponent(host: HostCosts, level: FreshLevel, prov: dict[str, str]) -> HostCosts:
    """``host`` with the exponent by which its eager launches follow the reading, where the
    fresh runs measure one (cbsim/profiling/eager_exponent.py); provenance says so either way."""
    exponent, why = level.eager_fit
    if exponent is None:
        prov["host.level.eager_exponent"] = f"kept at {host.level.eager_exponent}: {why}"
        return host
    prov["host.level.eager_exponent"] = why
    return dataclasses.replace(host, level=dataclasses.replace(host.level, eager_exponent=exponent))


def level_summary(level: FreshLevel) -> dict[str, Any]:
    """For the manifest: each run's host, forward and eager launch factor, the medians and the
    spread."""
    runs: dict[str, dict[str, float]] = {
        run: {"host": round(m.host, 4), "forward": round(m.forward, 4)}
        for run, m in level.machines.items()
    }
    for run, factor in level.eager_runs.items():
        runs.setdefault(run, {})["eager"] = round(factor, 4)
    return {
        "host_factor": round(level.host, 4),
        "forward_factor": round(level.forward, 4),
        "between_calls": round(level.between_calls, 4),
        "python_us": level.python_us,
        "eager_factor": None if level.eager is None else round(level.eager, 4),
        "eager_exponent": level.eager_fit[0],
        "runs": dict(sorted(runs.items())),
    }


def add_fresh(root: Path, sources: list[str], device_name: str) -> list[str]:
    """Fresh runs recorded on other machines of this GPU (``extra.fresh_from``: each a folder of
    run folders holding the fresh command's trace_sync/trace_async) copied into
    root/fresh/gpu-<uuid>/, one folder per machine (its GPU's uuid); returns those folders.
    Refused in one line, before anything is copied: a source without runs, a run of another GPU
    or of two machines, a machine the profile already holds."""
    plans = []
    for src in sources:
        folder = Path(src).expanduser().resolve()
        runs = sorted({p.parent for p in folder.glob("**/trace_sync.json.gz")})
        if not runs:
            raise ConfigError(
                f"extra.fresh_from: {src} holds no run folder with trace_sync.json.gz; allowed: "
                "folders of fresh runs (python -m cbsim mode=runtime engine=compare, the fresh "
                "probe's values, output.trace=true output.trace_gzip=true), one folder per machine"
            )
        others = {run: _other_data(run) for run in runs}
        machines = {_machine_of(run, others[run], device_name) for run in runs}
        if len(machines) != 1:
            raise ConfigError(
                f"extra.fresh_from: {src} holds runs of {len(machines)} machines "
                f"({', '.join(sorted(machines))}); allowed: one folder per machine"
            )
        dest = root / FRESH_DIR / f"gpu-{machines.pop()}"
        if dest.exists() or dest in (d for d, _ in plans):
            raise ConfigError(
                f"extra.fresh_from: {src}: the profile already holds this machine's fresh runs "
                f"({dest}); allowed: runs of a machine not added yet (remove {dest} to replace)"
            )
        # a run without CUDA graphs is an eager run (the eager launch level only)
        plans.append((dest, [(run, others[run].get("cuda_graphs", True)) for run in runs]))
    for dest, runs in plans:
        partial = dest.with_name(dest.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        counts = {"run": 0, EAGER_PREFIX: 0}
        for run, graphed in runs:
            kind = "run" if graphed else EAGER_PREFIX
            counts[kind] += 1
            name = f"{kind}_{counts[kind]}"
            shutil.copytree(run, partial / name, ignore=shutil.ignore_patterns(".cbsim.lock"))
        partial.rename(dest)
    return [str(dest.relative_to(root)) for dest, _ in plans]


def _other_data(run: Path) -> dict[str, Any]:
    """A fresh run's trace metadata (its sync trace's otherData), refused in one line if unread."""
    try:
        return read_trace(run / "trace_sync.json.gz").other_data
    except TraceError as exc:
        raise ConfigError(f"extra.fresh_from: {run}: {exc}") from None


def _machine_of(run: Path, other: dict[str, Any], device_name: str) -> str:
    """The short uuid of the GPU a fresh run recorded; refused if it is not ``device_name``."""
    hw = hardware_of(other)
    name, uuid = str(hw.get("name") or ""), str(hw.get("uuid") or "")
    if device_name and name != device_name:
        raise ConfigError(
            f"extra.fresh_from: {run} ran on {name or 'no recorded GPU'}; allowed: runs of "
            f"{device_name}, the profile's GPU"
        )
    if not uuid:
        raise ConfigError(f"extra.fresh_from: {run} records no GPU uuid; allowed: runtime traces")
    return uuid.split("-")[0]
