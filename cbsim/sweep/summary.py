"""A sweep directory as tables: one row per job (summary.csv) and one per sync/async pair.

Jobs are found on disk, so the summary is the same whoever ran them (the basic launcher, joblib,
submitit, Ray) and after any number of interrupted runs: a job directory holds Hydra's
``.hydra/overrides.yaml``; a job is finished when its finished marker (cbsim.rundir, written last)
still matches the files it names. The jobs the sweep asked for come from ``multirun.yaml`` (the sweep's
overrides, expanded as Hydra's basic sweeper does), so jobs never started are listed too.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from omegaconf import DictConfig, OmegaConf

from cbsim.rundir import COMPARISON_FILE as COMPARISON_FILE
from cbsim.rundir import FINISHED_FILE, atomic_write_text, finished_metrics, read_json
from cbsim.rundir import SUMMARY_FILE as SUMMARY_FILE

FINISHED, NOT_FINISHED, NOT_STARTED = "finished", "not finished", "not started"
ENGINE_KEY = "engine"
# the metrics a reader looks for first come right after the overrides in summary.csv
LEAD_METRICS = (
    "speedup",
    "total_time_s",
    "gpu_idle_fraction",
    "step_time_ms_mean",
    "tokens_per_s",
    "steps",
    "hazards",
    "fits_device",
)


# a point's bands (metrics "bands", cbsim.bands.predict_bands) as comparison.csv's columns:
# column stem -> the path in the bands dict; each stem gets _p5, _median and _p95
BAND_COLUMNS = {
    "speedup": ("speedup",),
    "gpu_idle_sync": ("sync", "gpu_idle_fraction"),
    "gpu_idle_async": ("async", "gpu_idle_fraction"),
    "time_sync_s": ("sync", "total_time_s"),
    "time_async_s": ("async", "total_time_s"),
}
BAND_QUANTILES = ("p5", "median", "p95")


@dataclass
class Job:
    num: int | None
    overrides: list[str]
    dir: Path | None
    status: str
    metrics: dict[str, Any] = field(default_factory=dict)


def override_key(override: str) -> str:
    key = override.split("=", 1)[0]
    return key.lstrip("+~")


def override_value(override: str) -> Any:
    """The value as YAML reads it (1024 -> int), or the text."""
    text = override.split("=", 1)[1] if "=" in override else ""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (int, float, str, bool)) or value is None else text


def expected_overrides(multirun_cfg: DictConfig) -> list[list[str]] | None:
    """Every job's overrides, as the basic sweeper expands them; None when it cannot tell."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        target = str(OmegaConf.select(multirun_cfg, "hydra.sweeper._target_") or "")
        if target and not target.endswith(("BasicSweeper", "PrecomposedSweeper")):
            return None
        params = OmegaConf.select(multirun_cfg, "hydra.sweeper.params") or {}
        args = [f"{k}={v}" for k, v in params.items()]
        args += list(OmegaConf.select(multirun_cfg, "hydra.overrides.task") or [])
        parsed = OverridesParser.create().parse_overrides(args)
        batches = BasicSweeper.split_arguments(parsed, None)
        return [list(job) for job in batches[0]]
    except Exception:  # an unusual sweep: the summary falls back to the job dirs found
        return None


def read_metrics(job_dir: Path) -> dict[str, Any] | None:
    """The metrics of a finished job whose files still match its marker, else None."""
    return finished_metrics(job_dir)


def _yaml(path: Path) -> Any:
    """YAML through libyaml when it is there (Hydra's files, read once per job)."""
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _job_record(job_dir: Path) -> tuple[int | None, list[str]] | None:
    """A job's number and overrides: from its finished marker, else from Hydra's .hydra/."""
    marker = read_json(job_dir / FINISHED_FILE)
    job = marker.get("job") if isinstance(marker, dict) else None
    if isinstance(job, dict) and isinstance(job.get("overrides"), list):
        return job.get("num"), [str(o) for o in job["overrides"]]
    try:
        overrides = [str(o) for o in (_yaml(job_dir / ".hydra" / "overrides.yaml") or [])]
    except (OSError, yaml.YAMLError):
        return None
    try:
        num = int(_yaml(job_dir / ".hydra" / "hydra.yaml")["hydra"]["job"]["num"])
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        num = None
    return num, overrides


def job_dirs(sweep_dir: Path) -> dict[frozenset[str], tuple[int | None, Path]]:
    """Job directories under the sweep, by their set of overrides."""
    found: dict[frozenset[str], tuple[int | None, Path]] = {}
    for ov_file in sorted(sweep_dir.glob("**/.hydra/overrides.yaml")):
        job_dir = ov_file.parent.parent
        record = _job_record(job_dir) if job_dir != sweep_dir else None
        if record is not None:
            found[frozenset(record[1])] = (record[0], job_dir)
    return found


def collect_jobs(sweep_dir: Path, multirun_cfg: DictConfig | None = None) -> list[Job]:
    """The sweep's jobs: each expected one (in sweep order), then any other job dir found."""
    sweep_dir = Path(sweep_dir)
    if multirun_cfg is None and (sweep_dir / "multirun.yaml").is_file():
        multirun_cfg = OmegaConf.load(sweep_dir / "multirun.yaml")
    expected = expected_overrides(multirun_cfg) if multirun_cfg is not None else None
    found = job_dirs(sweep_dir)
    jobs: list[Job] = []
    for i, overrides in enumerate(expected or []):
        num, job_dir = found.pop(frozenset(overrides), (i, None))
        jobs.append(_job(num if num is not None else i, overrides, job_dir))
    for key, (num, job_dir) in sorted(found.items(), key=lambda kv: (kv[1][0] is None, kv[1])):
        record = _job_record(job_dir)
        jobs.append(_job(num, record[1] if record else sorted(key), job_dir))
    return jobs


def _job(num: int | None, overrides: list[str], job_dir: Path | None) -> Job:
    if job_dir is None:
        return Job(num, overrides, None, NOT_STARTED)
    metrics = read_metrics(job_dir)
    if metrics is None:
        return Job(num, overrides, job_dir, NOT_FINISHED)
    return Job(num, overrides, job_dir, FINISHED, metrics)


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys; lists as JSON text."""
    out: dict[str, Any] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(obj, (list, tuple)):
        out[prefix[:-1]] = json.dumps(obj)
    else:
        out[prefix[:-1]] = obj
    return out


def summary_frame(jobs: list[Job], sweep_dir: Path) -> pd.DataFrame:
    """One row per job: job, status, dir, overrides, each override key, each metric."""
    rows = []
    for job in jobs:
        row: dict[str, Any] = {
            "job": job.num,
            "status": job.status,
            "dir": str(job.dir.relative_to(sweep_dir)) if job.dir else "",
            "overrides": " ".join(job.overrides),
        }
        for o in job.overrides:
            row[override_key(o)] = override_value(o)
        for k, v in flatten(job.metrics).items():
            row.setdefault(k, v)
        rows.append(row)
    frame = pd.DataFrame(rows)
    first = [c for c in frame.columns if c in row_keys(jobs)]
    lead = [c for c in frame.columns if c.split(".")[-1] in LEAD_METRICS and c not in first]
    lead.sort(key=lambda c: LEAD_METRICS.index(c.split(".")[-1]))
    # then the bands' quantiles: bands.speedup.p5 / .median / .p95, bands.sync.total_time_s.*, ...
    bands = sorted(
        (c for c in frame.columns if c.startswith("bands.") and c.split(".")[-1] in BAND_QUANTILES),
        key=_band_order,
    )
    rest = [c for c in frame.columns if c not in first and c not in lead and c not in bands]
    return frame[first + lead + bands + rest]


def _band_order(column: str) -> tuple[int, int, int]:
    """speedup, then sync and async; total time before GPU idle; P5, median, P95."""
    parts = column.split(".")
    groups, metrics = ("speedup", "sync", "async"), ("total_time_s", "gpu_idle_fraction")
    group = groups.index(parts[1]) if parts[1] in groups else len(groups)
    metric = metrics.index(parts[2]) if len(parts) > 3 and parts[2] in metrics else 0
    return group, metric, BAND_QUANTILES.index(parts[-1])


def row_keys(jobs: list[Job]) -> list[str]:
    return ["job", "status", "dir", "overrides", *override_keys(jobs)]


def override_keys(jobs: list[Job]) -> list[str]:
    return list(dict.fromkeys(override_key(o) for j in jobs for o in j.overrides))


def comparison_frame(jobs: list[Job]) -> pd.DataFrame:
    """One row per setting with both engines finished: speedup and GPU idle of each.

    Pairs sync and async jobs that share every other override; an engine=compare job is a pair
    by itself (its metrics.json holds sync, async and comparison).
    """
    keys = [k for k in override_keys(jobs) if k != ENGINE_KEY]
    by_setting: dict[tuple, dict[str, dict[str, Any]]] = {}
    for job in jobs:
        if job.status != FINISHED:
            continue
        ov = {override_key(o): override_value(o) for o in job.overrides}
        setting = tuple(ov.get(k) for k in keys)
        m = job.metrics
        if "sync" in m and "async" in m:
            by_setting.setdefault(setting, {}).update(sync=m["sync"], async_=m["async"])
        elif m.get("engine") in ("sync", "async"):
            name = "async_" if m["engine"] == "async" else "sync"
            by_setting.setdefault(setting, {})[name] = m
        if isinstance(m.get("bands"), dict):  # both engines' bands, whichever job drew them
            by_setting.setdefault(setting, {})["bands"] = m["bands"]
    rows = []
    for setting, pair in by_setting.items():
        if "sync" not in pair or "async_" not in pair:
            continue
        s, a = pair["sync"], pair["async_"]
        ts, ta = s.get("total_time_s"), a.get("total_time_s")
        rows.append(
            {
                **dict(zip(keys, setting)),
                "speedup": ts / ta if ts and ta else math.nan,
                "gpu_idle_sync": s.get("gpu_idle_fraction"),
                "gpu_idle_async": a.get("gpu_idle_fraction"),
                "time_sync_s": ts,
                "time_async_s": ta,
                "step_ms_sync": s.get("step_time_ms_mean"),
                "step_ms_async": a.get("step_time_ms_mean"),
                "hazards_async": a.get("hazards"),
                **band_columns(pair.get("bands")),
            }
        )
    return pd.DataFrame(rows, columns=None if rows else [*keys, "speedup"])


def band_columns(bands: dict[str, Any] | None) -> dict[str, Any]:
    """A setting's bands as flat columns (speedup_p5, ..., time_async_s_p95); none without."""
    if not bands:
        return {}
    out = {}
    for stem, path in BAND_COLUMNS.items():
        node: Any = bands
        for key in path:
            node = (node or {}).get(key)
        for q in BAND_QUANTILES:
            out[f"{stem}_{q}"] = (node or {}).get(q)
    return out


def write_csv(frame: pd.DataFrame, path: Path) -> Path:
    return atomic_write_text(path, frame.to_csv(index=False, quoting=csv.QUOTE_MINIMAL))
