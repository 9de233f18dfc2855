"""Recorded traces as calibration data: where they are, what is known about each (its manifest),
the config it ran with, and its per-step tables, each built once per trace."""

from __future__ import annotations

import dataclasses
import glob
import os
from dataclasses import dataclass
from functools import cached_property
from importlib.resources import files
from pathlib import Path

import numpy as np
import pandas as pd

from cbsim.calibration.manifest import Manifest, manifest_of
from cbsim.calibration.run_config import (
    SCHEDULE,
    UPDATE,
    config_of,
    replay,
    replay_batches,
)
from cbsim.calibration.steps import forward_table, span_table, with_replayed_batches
from cbsim.config import CbsimConfig, ConfigError
from cbsim.config.schema import BLAS_LIBRARIES, MIXED_GRAPHS, DecodeLaunchConfig
from cbsim.costs.decode_kernel import RULE_BEFORE
from cbsim.trace import Trace, TraceError, read_trace
from cbsim.trace import schema as S
from cbsim.trace.hardware import hardware_of
from cbsim.trace.merge import is_merged

# where recorded runs live unless extra.recordings says otherwise (relative to the working
# directory): a checkout's experiments/recordings/, one folder per GPU, one per set below it
DEFAULT_RECORDINGS = "experiments/recordings"
# a trace's timestamps are microseconds with three decimals (trace/builder.py rounds them)
TRACE_RESOLUTION_US = 1e-3


# the compact recorded set shipped as package data (cbsim/recorded/h200/six_workloads, with its
# manifest), laid out as experiments/recordings is, for an install without a checkout
PACKAGED_RECORDINGS = Path(str(files("cbsim") / "recorded"))


def recordings_root(value: str | os.PathLike[str] | None = None) -> Path:
    """The recordings directory: ``value`` (absolute, or relative to the working directory);
    left at the default where the working directory has none (a plain ``pip install``), the
    compact set shipped with the package."""
    asked = str(value or DEFAULT_RECORDINGS)
    p = Path(os.path.expanduser(asked))
    p = p if p.is_absolute() else Path.cwd() / p
    if asked == DEFAULT_RECORDINGS and not p.is_dir() and PACKAGED_RECORDINGS.is_dir():
        return PACKAGED_RECORDINGS
    return p


def describe_root(root: Path) -> str:
    """Which recordings a run reads, in one line."""
    if root == PACKAGED_RECORDINGS:
        return (
            f"recordings: {root} (the compact set shipped with cbsim, "
            f"{', '.join(sorted(str(d.relative_to(root)) for d in root.glob('*/*') if d.is_dir()))}; no "
            f"{DEFAULT_RECORDINGS} in {Path.cwd()}: a checkout's holds every recording, "
            "extra.recordings=DIR names another)"
        )
    return f"recordings: {root}"


def label(path: str | os.PathLike[str], root: Path | None = None) -> str:
    """A trace's name in tables and profiles: its path under the recordings directory when it
    is there (session/case/file), else its folder and file name."""
    p = Path(path).resolve()
    if root is not None:
        try:
            return str(p.relative_to(Path(root).resolve()))
        except ValueError:
            pass
    return f"{p.parent.name}/{p.name}"


def resolve_traces(patterns: list[str], root: Path | None = None) -> list[Path]:
    """Paths or globs: absolute, relative to the working directory, or else to ``root`` (the
    recordings directory)."""
    root = recordings_root() if root is None else Path(root)
    out: list[Path] = []
    for pattern in patterns:
        p = Path(os.path.expanduser(pattern))
        found: list[str] = []
        for base in (Path.cwd(), root):
            full = p if p.is_absolute() else base / p
            found = sorted(glob.glob(str(full), recursive=True))
            if found or p.is_absolute():
                break
        if not found:
            raise ConfigError(_not_found(pattern, root))
        out.extend(Path(f) for f in found if Path(f) not in out)
    return out


def _not_found(pattern: str, root: Path) -> str:
    if not root.is_dir():
        return (
            f"trace={pattern!r}: no such file in {Path.cwd()}, and the recordings directory "
            f"{root} does not exist (recordings are expected there: run from a checkout, or "
            "set extra.recordings=DIR, absolute or relative to the working directory)"
        )
    return (
        f"trace={pattern!r}: no such file (tried relative to {Path.cwd()} and to the "
        f"recordings directory {root}); pass trace=[path,...] with paths or globs"
    )


@dataclass
class Recorded:
    """One trace and the config it ran with."""

    path: Path
    trace: Trace
    # the recordings directory it was found in (names and manifests are read relative to it)
    root: Path | None = None
    # the command line's config, taken as the run config of a trace that carries none (a
    # Kineto import, with extra.workload_from_cli): its forwards get the replayed batches
    assumed: CbsimConfig | None = None

    @property
    def imported(self) -> bool:
        """A trace whose run config is the command line's (a profiler import)."""
        return self.assumed is not None

    @property
    def name(self) -> str:
        n = label(self.path, self.root)
        for suffix in (".gz", ".json"):
            n = n.removesuffix(suffix)
        return n

    @cached_property
    def manifest(self) -> Manifest:
        """What is known about the recording (manifest.yaml files beside it)."""
        return manifest_of(self.path, self.root)

    @property
    def session(self) -> str:
        """The recorded set (experiments/recordings/<gpu>/<set>/...)."""
        return self.manifest.session

    @property
    def stack(self) -> str:
        """One runtime version on one device host: runs of one stack may be fitted together."""
        return self.manifest.stack

    @property
    def call(self) -> str:
        """The device call that recorded the run."""
        return self.manifest.call

    @property
    def model_key(self) -> str:
        """Runs of one model shape (its weights' source aside)."""
        model = dataclasses.asdict(self.config.model)
        model.pop("path", None)
        return repr(model)

    @property
    def workload_key(self) -> str:
        """Runs of one workload: the same requests and batching limits (the engine aside)."""
        return repr(dataclasses.asdict(self.config.workload))

    @property
    def engine(self) -> str:
        return self.trace.engine or self.config.engine.name

    @property
    def host_python_us(self) -> float | None:
        """The host's speed as the runtime read it at the run's start (otherData.hardware,
        cbsim/host.py), None where the trace has no reading (a simulation, older builds)."""
        value = hardware_of(self.trace.other_data).get("host_python_us")
        return float(value) if isinstance(value, (int, float)) and value > 0 else None

    @cached_property
    def config(self) -> CbsimConfig:
        """The run config, with what the runtime reports it actually did (its graph buckets,
        whether graphs ran at all) in place of what was asked for."""
        cfg = self.assumed or config_of(self.trace, str(self.path))
        other, eng = self.trace.other_data, cfg.engine
        buckets = other.get("graph_buckets")
        if isinstance(buckets, list) and buckets and all(isinstance(b, int) for b in buckets):
            eng = dataclasses.replace(eng, graph_batch_sizes=sorted(buckets))
        if isinstance(other.get("cuda_graphs"), bool):
            eng = dataclasses.replace(eng, cuda_graphs=other["cuda_graphs"])
        if self.assumed is None and self.trace.source == "runtime":
            # a graph per decode-kernel launch class, as the build says; builds before it had
            # one table width (the run's longest request's)
            classes = other.get("graph_width_classes")
            eng = dataclasses.replace(eng, graph_width_classes=classes is True)
            eng = dataclasses.replace(eng, decode_launch=_decode_launch(other))
            # eager steps padded as the build says; builds before it ran their own token count
            multiple = other.get("eager_token_multiple")
            multiple = multiple if isinstance(multiple, int) and multiple >= 1 else 1
            eng = dataclasses.replace(eng, eager_token_multiple=multiple)
            # short continuations as decode rows as the build says; builds before it: none
            short = other.get("continuation_decode_max")
            short = short if isinstance(short, int) and short >= 0 else 0
            eng = dataclasses.replace(eng, continuation_decode_max=short)
            # graphs launched once at capture as the build says; builds before it: in a step
            eng = dataclasses.replace(eng, upload_graphs=other.get("graphs_uploaded") is True)
            # prompt steps replayed from graphs as the build says; builds before it: eagerly
            mixed = other.get("mixed_graphs")
            eng = dataclasses.replace(eng, mixed_graphs=mixed if mixed in MIXED_GRAPHS else "off")
        return dataclasses.replace(cfg, engine=eng, mode=self._build_mode(cfg.mode))

    def _build_mode(self, mode):
        """The build's kernels as the trace records them (otherData.fused, .blas, .graph_blas,
        .argmax), else as its manifest says or as every build before the key ran (a runtime
        trace's config is its command line, which names what was asked for)."""
        if self.assumed is not None or self.trace.source != "runtime":
            return mode
        other = self.trace.other_data
        fused = other.get("fused")
        if isinstance(fused, dict) and isinstance(fused.get("epilogues"), bool):
            epilogues = fused["epilogues"]
        else:
            epilogues = self.manifest.fused_epilogues
        # RoPE inside the K/V write: only where the trace says so (no build before it did)
        rope_kv = isinstance(fused, dict) and fused.get("rope_kv") is True
        blas = other.get("blas") if other.get("blas") in BLAS_LIBRARIES else "cublas"
        graph_blas = other.get("graph_blas")
        return dataclasses.replace(
            mode,
            fuse_epilogues=epilogues,
            fuse_rope_kv=rope_kv,
            blas=blas,
            graph_blas=graph_blas if graph_blas in BLAS_LIBRARIES else blas,
            split_argmax=other.get("argmax") == "split",
        )

    @cached_property
    def spans(self) -> pd.DataFrame:
        sp = span_table(self.trace)
        if self.imported:
            sp = with_replayed_batches(sp, replay(self.config, self.engine))
        return sp

    @cached_property
    def forward(self) -> pd.DataFrame:
        """The forward spans with what ran with them (``steps.forward_table``), built once per
        trace and shared by every fit: read it, never change it in place."""
        return forward_table(self.spans, self.trace.source, self.engine)

    @cached_property
    def batches(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Per step, the batch's per-request query and context lengths, by replaying the shared
        scheduler on the recorded workload: offline, in the engine's order (the batches do not
        depend on time); online, on the recording's own clock (``host_clock``). Steps whose
        totals disagree with the trace's args are left out."""
        clock = None if self.config.workload.arrival == "offline" else host_clock(self.spans)
        replayed = replay_batches(self.config, self.engine, clock) or {}
        fwd = self.forward
        out = {}
        for r in fwd.itertuples():
            got = replayed.get(int(r.step))
            if got is None:
                continue
            q, ctx = got
            if (len(q), int(q.sum()), int(ctx.sum())) == (r.requests, r.query_tokens, r.kv_tokens):
                out[int(r.step)] = got
        return out


def host_clock(spans: pd.DataFrame) -> list[tuple[float, int, int]]:
    """When the recording asked the scheduler for each batch and gave it each batch's tokens:
    (seconds, SCHEDULE or UPDATE, step) from the start of its schedule and update spans."""
    host = spans[(spans.lane == S.HOST) & spans.name.isin((S.SCHEDULE, S.UPDATE))]
    host = host[host.step.notna() & (host.step >= 0)]  # a schedule that returned no batch: -1
    what = np.where(host.name == S.SCHEDULE, SCHEDULE, UPDATE)
    # times are written to the nanosecond: a request that arrived as the scheduler was asked
    # (the simulator wakes exactly at an arrival) can read a nanosecond late
    at = (host.ts + TRACE_RESOLUTION_US) / 1e6
    return list(zip(at.tolist(), what.tolist(), host.step.astype(int).tolist()))


def load(paths: list[Path], root: Path | None = None) -> list[Recorded]:
    """The traces (normalised on read), with ``root`` the recordings directory they are in. A
    merged trace (a compare run's trace_compare) is left out: its runs are the per-engine
    traces written beside it."""
    out = []
    for p in paths:
        try:
            trace = read_trace(p)
        except TraceError as exc:
            raise ConfigError(str(exc)) from None
        if not is_merged(trace.other_data):
            out.append(Recorded(p, trace, root))
    return out


def forward_steps(rec: Recorded) -> pd.DataFrame:
    """The run's forward table (cached on the run)."""
    return rec.forward


def _decode_launch(other: dict) -> DecodeLaunchConfig:
    """The decode kernel's launch rule the build ran (otherData.decode_launch), else the rule
    of every build before it recorded one."""
    got = other.get("decode_launch")
    if isinstance(got, dict):
        try:
            return DecodeLaunchConfig(**got)
        except (TypeError, ConfigError):
            pass
    return DecodeLaunchConfig(**dataclasses.asdict(RULE_BEFORE))
