"""What is known about a recording, read from the manifest.yaml files beside it.

Facts about one recording (the command and commit that made it, the device call, a quirk such as a
cold first step) live with the recording, not in code. A trace's manifest is every manifest.yaml
from the recordings root down to the trace's own directory, the deeper one overriding, so a
session directory describes its runs and a sub-directory (one device call of a session) may
override what differs. Without any manifest the trace's directory names the session, the stack
and the call.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from cbsim.config import ConfigError

MANIFEST = "manifest.yaml"


@dataclass(frozen=True)
class Quirks:
    """Known one-offs of a recording that are not costs to fit."""

    # the first step paid a one-off set-up: judge total time and GPU idle after the first forward
    cold_first_step: bool = False


@dataclass(frozen=True)
class Manifest:
    """One recording directory's facts (experiments/recordings/<gpu>/<set>/manifest.yaml)."""

    session: str
    # runs of one stack (one runtime version on one device host) may be fitted together
    stack: str
    # the device call that recorded the runs: they share one host's speed
    call: str
    recorded: str = ""
    commit: str = ""
    command: str = ""
    # the GPU and host the set was recorded on, as the device reported them
    gpu: str = ""
    hardware: str = ""
    software: str = ""
    model: str = ""
    runtime: str = ""
    workloads: tuple[str, ...] = ()
    quirks: Quirks = field(default_factory=Quirks)
    # whether the runtime build fused the epilogues (mode.fuse_epilogues), for traces that do not
    # say it themselves (otherData.fused); a build without the option did not
    fused_epilogues: bool = False
    notes: str = ""
    # what the docs say of the set, each checked against its traces by tests/test_recorded_claims.py:
    # {run: <case folder>, metric: <metrics key or speedup>, engine: sync|async, value, within}
    claims: tuple[dict[str, Any], ...] = ()


FIELDS = {f.name for f in dataclasses.fields(Manifest)}
QUIRKS = {f.name for f in dataclasses.fields(Quirks)}


def manifest_of(trace_path: Path, root: Path | None) -> Manifest:
    """The merged manifest of a trace: every manifest.yaml from ``root`` (or the filesystem
    root when the trace is not under it) down to the trace's directory."""
    folder = Path(trace_path).resolve().parent
    chain = [folder, *folder.parents]
    top = Path(root).resolve() if root is not None else None
    if top in chain:
        chain = chain[: chain.index(top) + 1]
    data: dict[str, Any] = {}
    quirks: dict[str, Any] = {}
    outer = None  # the outermost directory with a manifest: the session's
    for d in reversed(chain):
        raw = _read(d / MANIFEST)
        if raw is None:
            continue
        outer = outer or d
        quirks.update(raw.pop("quirks", None) or {})
        data.update(raw)
    name = data.get("session") or _default_session(folder, outer, top)
    data.setdefault("session", name)
    data.setdefault("stack", name)
    data.setdefault("call", name)
    data["workloads"] = tuple(data.get("workloads") or ())
    data["claims"] = tuple(data.get("claims") or ())
    return Manifest(**data, quirks=Quirks(**quirks))


def _default_session(folder: Path, outer: Path | None, top: Path | None) -> str:
    """The manifest's directory; else the first directory under the recordings root (a session
    of cases: <session>/<case>/trace_*.json.gz); else the trace's own directory."""
    if outer is not None:
        return outer.name
    if top is not None and top != folder and top in folder.parents:
        return folder.relative_to(top).parts[0]
    return folder.name


@lru_cache(maxsize=256)
def _read_cached(path: Path, mtime: float) -> dict[str, Any] | None:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{path}: not a readable manifest ({first})") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a manifest is a mapping of {', '.join(sorted(FIELDS))}")
    unknown = sorted(set(raw) - FIELDS)
    if unknown:
        raise ConfigError(
            f"{path}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(FIELDS))}"
        )
    quirks = raw.get("quirks") or {}
    if not isinstance(quirks, dict) or set(quirks) - QUIRKS:
        bad = sorted(set(quirks) - QUIRKS) if isinstance(quirks, dict) else [str(quirks)]
        raise ConfigError(f"{path}: unknown quirk {bad[0]!r}; allowed: {', '.join(sorted(QUIRKS))}")
    for k, v in quirks.items():
        if not isinstance(v, bool):
            raise ConfigError(f"{path}: quirks.{k}={v!r}; allowed: true or false")
    for k in ("session", "stack", "call"):
        if k in raw and not isinstance(raw[k], str):
            raise ConfigError(f"{path}: {k}={raw[k]!r}; allowed: a name (string)")
    if "fused_epilogues" in raw and not isinstance(raw["fused_epilogues"], bool):
        raise ConfigError(
            f"{path}: fused_epilogues={raw['fused_epilogues']!r}; allowed: true or false"
        )
    claims = raw.get("claims") or []
    if not isinstance(claims, list) or not all(isinstance(c, dict) for c in claims):
        raise ConfigError(f"{path}: claims is a list of mappings (run, metric, value, within)")
    kept = ("workloads", "quirks", "fused_epilogues", "claims")
    return {k: (str(v) if k not in kept else v) for k, v in raw.items()}


def _read(path: Path) -> dict[str, Any] | None:
    """The manifest file's keys (a copy), or None when there is none."""
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return None
    got = _read_cached(path, mtime)
    return None if got is None else {**got, "quirks": dict(got.get("quirks") or {})}
