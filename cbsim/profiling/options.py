"""The settings of ``task=profile_machine`` (conf/experiment/profile_machine.yaml): each extra key
with what it does, read and checked into one object before anything is measured, so a bad value
ends the command with one line naming the key."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from cbsim.config import ConfigError

EXTRA_KEYS = {
    "models": "the models whose kernel tables are measured (conf/model names; null: the composed "
    "model); the probes run the first, the model_probes every other",
    "model_probes": "the probes (names in extra.probes) that every model after the first runs too "
    "(probes/<probe>_<model>/): forwards of two model shapes tell a per-forward cost from the "
    "kernel tables' scale, which one shape's cannot",
    "out": "the profile directory written (built in <out>.partial, renamed when complete)",
    "name": "the profile's name (hardware/<name>.yaml); null: from the GPU's name",
    "max_minutes": "the time budget: a step that would overrun it is skipped and recorded so",
    "base": "the hardware profile the fit starts from (a name); terms the probes cannot "
    "determine keep its value; null: the composed hardware (hardware=h200_estimates)",
    "kernels": "the kernel-table grid (the extra keys of +experiment=profile_kernels)",
    "probes": "the probe runs: each a name, a repeat count and the config values it sets",
    "estimates_s": "seconds each step is expected to take, for the ETA and the budget",
    "refit": "re-fit this existing profile directory from its probes (no GPU needed)",
    "kernel_tables": "kernel tables already made on this GPU by +experiment=profile_kernels (a "
    "directory, or a hardware config's kernel_table path), used in place of measuring them; a "
    "refit keeps the manifest's; null: measured",
    "commit": "the cbsim commit named in the manifest when git cannot tell it",
    "cpu": "on a CPU device (a smoke test): caps on each probe's values, its repeats, and the "
    "kernel grid",
    "forward_samples": "forward spans used per probe trace by the forward fit (8 or more)",
    "starts": "starts of the forward fit, the best kept (1, 2 or 3)",
    "fresh_runs": "separate `python -m cbsim` processes of the fresh_probe, whose median host "
    "factor sets the profile's host level and whose spread sets host.spread.between_calls (0: none)",
    "fresh_probe": "the probe (a name in extra.probes) the fresh runs repeat",
    "fresh_eager_runs": "separate processes of the fresh_eager_probe, whose median eager launch "
    "factor sets the level of the eager launch costs (0: the fresh runs' eager steps, if any)",
    "fresh_eager_probe": "the probe (a name in extra.probes) the fresh eager runs repeat; "
    "null: the first probe that sets engine.cuda_graphs false (none: no eager runs)",
    "fresh_from": "with extra.refit: folders of fresh runs recorded on other machines of this GPU "
    "(one folder per machine), added to the profile's fresh/ before it is refitted",
}
NAME = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True)
class Probe:
    """One probe: its workload and engine values, run ``repeat`` times (both engines unless
    it sets engine.name)."""

    name: str
    values: dict[str, Any]
    repeat: int = 1


@dataclass
class ProfileOptions:
    models: list[str] = field(default_factory=list)
    out: str | None = None
    name: str | None = None
    max_minutes: float = 9.0
    base: str | None = None
    kernels: dict[str, Any] = field(default_factory=dict)
    probes: list[Probe] = field(default_factory=list)
    model_probes: list[str] = field(default_factory=list)
    estimates_s: dict[str, float] = field(default_factory=dict)
    refit: str | None = None
    kernel_tables: str | None = None
    commit: str | None = None
    forward_samples: int = 240
    starts: int = 3
    fresh_runs: int = 3
    fresh_probe: str = "reference"
    fresh_eager_runs: int = 2
    fresh_eager_probe: str | None = None
    fresh_from: list[str] = field(default_factory=list)
    cpu: dict[str, Any] = field(default_factory=dict)

    def on_cpu(self) -> ProfileOptions:
        """The smoke test's settings: every probe's values capped by cpu.caps (set where the
        probe leaves them), its repeats by cpu.repeat, the kernel grid updated by cpu.kernels."""
        caps = self.cpu.get("caps") or {}
        repeat = int(self.cpu.get("repeat", 10))
        only = self.cpu.get("only") or [p.name for p in self.probes]
        probes = []
        for p in (p for p in self.probes if p.name in only):
            values = dict(p.values)
            for key, cap in caps.items():
                values[key] = min(values.get(key, cap), cap)
            probes.append(Probe(p.name, values, min(p.repeat, repeat)))
        kernels = {**self.kernels, **(self.cpu.get("kernels") or {})}
        fresh = min(self.fresh_runs, int(self.cpu.get("fresh_runs", self.fresh_runs)))
        model_probes = [n for n in self.model_probes if n in only]
        # on a CPU every run launches eagerly: the fresh runs measure that level already
        return dataclasses.replace(
            self,
            probes=probes,
            model_probes=model_probes,
            kernels=kernels,
            fresh_runs=fresh,
            fresh_eager_runs=0,
        )

    def probes_of(self, model: str) -> list[Probe]:
        """The probes a model after the first runs, each named <probe>_<model>."""
        return [
            dataclasses.replace(p, name=f"{p.name}_{model}")
            for p in self.probes
            if p.name in self.model_probes
        ]


def _names(key: str, value: Any) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"extra.{key}={value!r}; allowed: a non-empty list of names")
    for v in value:
        if not NAME.match(v):
            raise ConfigError(f"extra.{key}: {v!r} is not a name; allowed: letters, digits, _ -")
    return list(value)


def _number(key: str, value: Any, lo: float, hi: float) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not lo < value <= hi:
        raise ConfigError(f"extra.{key}={value!r}; allowed: a number > {lo:g} and <= {hi:g}")
    return float(value)


def _probes(value: Any) -> list[Probe]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"extra.probes={value!r}; allowed: a non-empty list of probes")
    out = []
    for i, p in enumerate(value):
        where = f"extra.probes[{i}]"
        if not isinstance(p, dict) or not isinstance(p.get("name"), str):
            raise ConfigError(f"{where}={p!r}; allowed: a mapping with name, set and repeat")
        if not NAME.match(p["name"]) or p["name"] in {q.name for q in out}:
            raise ConfigError(f"{where}.name={p['name']!r}; allowed: a new name (letters, _ -)")
        bad = sorted(set(p) - {"name", "set", "repeat"})
        if bad:
            raise ConfigError(f"{where}.{bad[0]} is not a probe key; allowed: name, repeat, set")
        values, repeat = p.get("set") or {}, p.get("repeat", 1)
        if not isinstance(values, dict):
            raise ConfigError(f"{where}.set={values!r}; allowed: a mapping of config keys")
        if not isinstance(repeat, int) or isinstance(repeat, bool) or not 1 <= repeat <= 10:
            raise ConfigError(f"{where}.repeat={repeat!r}; allowed: 1 to 10")
        out.append(Probe(p["name"], dict(values), repeat))
    return out


def _model_probes(value: Any, probes: list[Probe]) -> list[str]:
    if value is None or value == []:
        return []
    names = _names("model_probes", value)
    known = [p.name for p in probes]
    for n in names:
        if n not in known:
            raise ConfigError(
                f"extra.model_probes: {n!r} is not a probe; allowed: {', '.join(known)}"
            )
    return names


def read_options(extra: dict[str, Any]) -> ProfileOptions:
    """The checked settings; ConfigError names the first bad key."""
    for key in extra:
        if key not in EXTRA_KEYS:
            raise ConfigError(
                f"extra.{key} is not a setting of task=profile_machine; allowed: "
                f"{', '.join(sorted(EXTRA_KEYS))}"
            )
    o = ProfileOptions()
    o.refit = _optional_text("refit", extra.get("refit"))
    o.out = _optional_text("out", extra.get("out"))
    if o.out is None and o.refit is None:
        raise ConfigError("extra.out is not set; allowed: the profile directory to write (a path)")
    if extra.get("models") is not None:
        o.models = _names("models", extra.get("models"))
    name = extra.get("name")
    o.name = None if name is None else _names("name", name)[0]
    o.max_minutes = _number("max_minutes", extra.get("max_minutes", 9.0), 0.0, 600.0)
    o.base = None if extra.get("base") is None else _names("base", extra["base"])[0]
    kernels = extra.get("kernels") or {}
    if not isinstance(kernels, dict):
        raise ConfigError(f"extra.kernels={kernels!r}; allowed: a mapping of profile_kernels keys")
    o.kernels = dict(kernels)
    if o.refit is None:
        o.probes = _probes(extra.get("probes"))
        o.model_probes = _model_probes(extra.get("model_probes"), o.probes)
    est = extra.get("estimates_s") or {}
    if not isinstance(est, dict):
        raise ConfigError(f"extra.estimates_s={est!r}; allowed: a mapping of step -> seconds")
    o.estimates_s = {k: _number(f"estimates_s.{k}", v, 0.0, 3600.0) for k, v in est.items()}
    o.commit = _optional_text("commit", extra.get("commit"))
    o.kernel_tables = _optional_text("kernel_tables", extra.get("kernel_tables"))
    cpu = extra.get("cpu") or {}
    keys = {"caps", "repeat", "kernels", "only", "fresh_runs"}
    bad = sorted(set(cpu) - keys) if isinstance(cpu, dict) else ["cpu"]
    if bad:
        raise ConfigError(f"extra.cpu.{bad[0]} is not a key; allowed: {', '.join(sorted(keys))}")
    for key, cap in (cpu.get("caps") or {}).items():
        _number(f"cpu.caps.{key}", cap, 0.0, 1e9)
    o.cpu = dict(cpu)
    o.forward_samples = int(_number("forward_samples", extra.get("forward_samples", 240), 7, 1e6))
    o.starts = int(_number("starts", extra.get("starts", 3), 0, 3))
    o.fresh_runs = _runs("fresh_runs", extra.get("fresh_runs", 3))
    fresh = extra.get("fresh_probe", "reference")
    o.fresh_probe = _fresh_probe(o, "fresh_probe", fresh, o.fresh_runs)
    o.fresh_eager_runs = _runs("fresh_eager_runs", extra.get("fresh_eager_runs", 2))
    eager = extra.get("fresh_eager_probe")
    if eager is None:  # the first probe without CUDA graphs
        no_graphs = (p.name for p in o.probes if p.values.get("engine.cuda_graphs") is False)
        eager = next(no_graphs, None)
    o.fresh_eager_probe = eager and _fresh_probe(o, "fresh_eager_probe", eager, o.fresh_eager_runs)
    o.fresh_from = _paths("fresh_from", extra.get("fresh_from"))
    if o.fresh_from and o.refit is None:
        raise ConfigError(
            "extra.fresh_from adds fresh runs to a profile that exists; allowed: with "
            "extra.refit=DIR (the profile directory)"
        )
    return o


def _runs(key: str, value: Any) -> int:
    """A count of fresh runs: an integer 0 to 10."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 10:
        raise ConfigError(f"extra.{key}={value!r}; allowed: an integer 0 to 10")
    return value


def _fresh_probe(o: ProfileOptions, key: str, value: Any, runs: int) -> str:
    """The probe a kind of fresh run repeats: one of the probes where ``runs`` of it will run."""
    name = _names(key, value)[0]
    if runs and o.refit is None and name not in {p.name for p in o.probes}:
        raise ConfigError(
            f"extra.{key}={name!r} is not a probe; allowed: {', '.join(p.name for p in o.probes)}"
        )
    return name


def _paths(key: str, value: Any) -> list[str]:
    if value is None or value == []:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(f"extra.{key}={value!r}; allowed: a list of folders (paths)")
    return list(value)


def _optional_text(key: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"extra.{key}={value!r}; allowed: a path")
    return value
