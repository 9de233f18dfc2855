"""Recorded traces as calibration data: where they are, the config each ran with, and per-step
tables of what each lane did."""

from __future__ import annotations

import dataclasses
import glob
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

import cbsim
from cbsim.config import CbsimConfig, ConfigError
from cbsim.config.schema import HardwareConfig
from cbsim.trace import Trace, TraceError, read_trace
from cbsim.trace import schema as S

# the repository (or installed package parent): relative trace paths are tried against it too
REPO = Path(cbsim.__file__).resolve().parents[1]


RECORDINGS = REPO / "experiments" / "runtime"


def label(path: str | os.PathLike[str]) -> str:
    """A trace's name in tables and profiles: its path under experiments/runtime/ when it is
    there (session/case/file), else its folder and file name."""
    p = Path(path).resolve()
    try:
        return str(p.relative_to(RECORDINGS.resolve()))
    except ValueError:
        return f"{p.parent.name}/{p.name}"


def resolve_traces(patterns: list[str]) -> list[Path]:
    """Paths or globs, relative to the working directory or else to the repository root."""
    out: list[Path] = []
    for pattern in patterns:
        found: list[str] = []
        for base in (Path.cwd(), REPO):
            p = Path(os.path.expanduser(pattern))
            full = p if p.is_absolute() else base / p
            found = sorted(glob.glob(str(full), recursive=True))
            if found:
                break
        if not found:
            raise ConfigError(
                f"trace={pattern!r}: no such file (tried relative to {Path.cwd()} and {REPO}); "
                "pass trace=[path,...] with paths or globs"
            )
        out.extend(Path(f) for f in found if Path(f) not in out)
    return out


@dataclass
class Recorded:
    """One trace and the config it ran with."""

    path: Path
    trace: Trace

    @property
    def name(self) -> str:
        n = label(self.path)
        for suffix in (".gz", ".json"):
            n = n.removesuffix(suffix)
        return n

    @property
    def session(self) -> str:
        """The recording session (experiments/runtime/<session>/...): one software stack."""
        try:
            return self.path.resolve().relative_to(RECORDINGS.resolve()).parts[0]
        except ValueError:
            return str(self.path.resolve().parent.parent)

    @property
    def engine(self) -> str:
        return self.trace.engine or self.config.engine.name

    @cached_property
    def config(self) -> CbsimConfig:
        """The run config, with what the runtime reports it actually did (its graph buckets,
        whether graphs ran at all) in place of what was asked for."""
        cfg = config_of(self.trace, str(self.path))
        other, eng = self.trace.other_data, cfg.engine
        buckets = other.get("graph_buckets")
        if isinstance(buckets, list) and buckets and all(isinstance(b, int) for b in buckets):
            eng = dataclasses.replace(eng, graph_batch_sizes=sorted(buckets))
        if isinstance(other.get("cuda_graphs"), bool):
            eng = dataclasses.replace(eng, cuda_graphs=other["cuda_graphs"])
        return dataclasses.replace(cfg, engine=eng)

    @cached_property
    def spans(self) -> pd.DataFrame:
        return span_table(self.trace)

    @cached_property
    def batches(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Per step, the batch's per-request query and context lengths, by replaying the shared
        scheduler on the recorded workload (offline workloads: the batches do not depend on
        time). Steps whose totals disagree with the trace's args are left out."""
        replayed = replay_batches(self.config, self.engine) or {}
        fwd = forward_steps(self)
        out = {}
        for r in fwd.itertuples():
            got = replayed.get(int(r.step))
            if got is None:
                continue
            q, ctx = got
            if (len(q), int(q.sum()), int(ctx.sum())) == (r.requests, r.query_tokens, r.kv_tokens):
                out[int(r.step)] = got
        return out


def load(paths: list[Path]) -> list[Recorded]:
    out = []
    for p in paths:
        try:
            out.append(Recorded(p, read_trace(p)))  # normalised on read
        except TraceError as exc:
            raise ConfigError(str(exc)) from None
    return out


def config_of(trace: Trace, where: str = "trace") -> CbsimConfig:
    """The run config a trace recorded in otherData.config, as typed objects."""
    raw = trace.other_data.get("config")
    overrides = trace.other_data.get("config_overrides")
    if not isinstance(raw, dict) and isinstance(overrides, list):
        raw = compose_overrides([str(o) for o in overrides], where)
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{where}: otherData.config is missing; it is needed to re-simulate "
            "the run (traces written by python -m cbsim carry it)"
        )
    raw = {k: v for k, v in raw.items() if k != "hydra"}
    try:
        merged = OmegaConf.merge(OmegaConf.structured(CbsimConfig), raw)
        obj = OmegaConf.to_object(merged)
    except (OmegaConfBaseException, ConfigError) as exc:
        raise ConfigError(f"{where}: otherData.config does not fit the schema ({exc})") from None
    return obj


def compose_overrides(overrides: list[str], where: str = "trace") -> dict[str, Any]:
    """The config ``python -m cbsim <overrides>`` would compose (for traces that recorded their
    overrides, otherData.config_overrides, rather than the resolved config). Works inside a
    running Hydra app too: its global state is set aside and put back."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    from cbsim.config.store import register_configs

    register_configs()
    backup = get_gh_backup()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="cbsim.conf", version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
        return OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"{where}: otherData.config_overrides do not compose ({exc})") from None
    finally:
        if backup is not None or GlobalHydra in _singletons():
            restore_gh_from_backup(backup)


def _singletons() -> dict:
    from hydra.core.singleton import Singleton

    return Singleton._instances


def replay_batches(
    config: CbsimConfig, engine: str
) -> dict[int, tuple[np.ndarray, np.ndarray]] | None:
    """Step -> (query_lens, context_lens) from the shared scheduler, driven in the engine's order
    (async: batch N+1 scheduled before N's update); None for online (Poisson) workloads."""
    from cbsim.scheduler import Scheduler, default_num_kv_blocks, run_to_completion
    from cbsim.workload import make_requests

    w = config.workload
    if w.arrival != "offline":
        return None
    requests = make_requests(w, config.model.vocab_size)
    sched = Scheduler(w, default_num_kv_blocks(w, requests))
    sched.add_all(requests)
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def keep(batch, _prev) -> None:
        out[int(batch.step)] = (np.array(batch.query_lens), np.array(batch.context_lens))

    try:
        run_to_completion(
            sched,
            lambda b: np.ones(b.num_samples, dtype=np.int64),
            overlap=engine == "async",
            on_batch=keep,
        )
    except (RuntimeError, ValueError):
        return None
    return out


def hardware_from(data: dict[str, Any]) -> HardwareConfig:
    """A HardwareConfig from a profile's dict (a YAML file's content, defaults list dropped)."""
    data = {k: v for k, v in data.items() if k != "defaults"}
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(HardwareConfig), data))
    except (OmegaConfBaseException, ConfigError) as exc:
        raise ConfigError(f"hardware profile does not fit the schema ({exc})") from None


def span_table(trace: Trace) -> pd.DataFrame:
    """The trace's span table plus the args calibration reads: copy ``bytes``, ``carry_over_us``."""
    return trace.span_frame({"bytes": None, "carry_over_us": None})


def gpu_lane(spans: pd.DataFrame) -> str:
    has_compute = (spans.lane == S.COMPUTE).any()
    return S.COMPUTE if has_compute or not (spans.lane == S.DEFAULT).any() else S.DEFAULT


def forward_steps(rec: Recorded) -> pd.DataFrame:
    """Per forward span: its args, whether a carry-over ran with it (``carry``) and whether that
    was a span of its own (``carry_span``, else inside the replay: arg ``carry_over_us``)."""
    sp = rec.spans
    lane = gpu_lane(sp)
    fwd = sp[(sp.lane == lane) & sp.name.isin(S.FORWARD_NAMES)].copy()
    carry = set(sp[(sp.lane == lane) & (sp.name == S.CARRY_OVER)].step)
    fwd["graph"] = fwd.name == S.GRAPH_REPLAY
    fwd["carry_span"] = fwd.step.isin(carry)
    fwd["carry"] = fwd.carry_span | fwd.carry_over_us.notna()
    if rec.trace.source == "runtime" and rec.engine == "async" and not fwd.carry.any():
        # the runtime's carry-over is captured in the graph and not marked: every decode step
        # after the first launch scatters the previous batch's tokens
        fwd["carry"] = (fwd.kind != "prefill") & (fwd.step > fwd.step.min())
    return fwd[fwd.requests > 0]


def samples_by_step(rec: Recorded) -> pd.Series:
    fwd = forward_steps(rec)
    return fwd.groupby("step")["new_tokens"].sum()


class StepShape:
    """What CostModel.forward reads from a scheduler Batch: the replayed batch's per-request
    lengths when known (``Recorded.batches``), else the span's totals shared evenly over the
    requests (exact for decode, an approximation for prefill)."""

    def __init__(
        self,
        requests: int,
        query_tokens: int,
        kv_tokens: int,
        samples: int,
        kind: str,
        lens: tuple[np.ndarray, np.ndarray] | None = None,
    ):
        self.n = requests
        self.query_tokens, self.kv_tokens, self.num_samples = query_tokens, kv_tokens, samples
        self.kind = kind
        if lens is not None:
            self.query_lens, self.context_lens = lens
        else:
            self.query_lens = _even(query_tokens, requests)
            self.context_lens = _even(kv_tokens, requests)
        # context = the cached prefix + this step's tokens
        self.start_pos = self.context_lens - self.query_lens

    def __len__(self) -> int:
        return self.n


def _even(total: int, n: int) -> np.ndarray:
    base = np.full(n, total // n, dtype=np.int64)
    base[: total - base.sum()] += 1
    return base


def step_shapes(rec: Recorded, fwd: pd.DataFrame) -> list[StepShape]:
    """A StepShape per forward span row (``forward_steps``)."""
    return [
        StepShape(
            int(r.requests),
            int(r.query_tokens),
            int(r.kv_tokens),
            int(r.new_tokens),
            r.kind,
            rec.batches.get(int(r.step)),
        )
        for r in fwd.itertuples()
    ]
