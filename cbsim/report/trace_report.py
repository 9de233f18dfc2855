"""A report for trace files alone: any producer of the format (sim, runtime, an imported Kineto
trace) is drawn by the same code. With the run config in otherData it is the full run report;
without one (a profiler import) the metrics, the timeline and the step times.

    python -m cbsim.report TRACE [TRACE ...] [-o report.html]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cbsim.config import CbsimConfig, ConfigError
from cbsim.config.store import load_config
from cbsim.metrics import compute_metrics, format_table
from cbsim.report.charts import step_time_figure
from cbsim.report.frames import run_frames
from cbsim.report.html import Page, table
from cbsim.report.run_report import write_run_report
from cbsim.report.timeline import overview_figure
from cbsim.trace import Trace, TraceError, read_trace

GENERIC_KEYS = (
    "total_time_s",
    "steps",
    "step_time_ms_p50",
    "step_time_ms_p99",
    "gpu_idle_fraction",
    "cpu_blocked_fraction",
    "cpu_blocks_per_step",
    "gpu_forward_ms_mean",
)


def config_of(trace: Trace) -> CbsimConfig | None:
    """The run config a trace recorded, validated; None when it holds none that fits."""
    raw = trace.other_data.get("config")
    if not isinstance(raw, dict) or "workload" not in raw:
        return None
    body = {k: v for k, v in raw.items() if k != "hydra"}
    try:
        return load_config(OmegaConf.merge(OmegaConf.structured(CbsimConfig), body))
    except (ConfigError, OmegaConfBaseException):
        return None


def write_trace_report(trace: Trace, path: Path, title: str) -> Path:
    """Metrics, the whole timeline and the step times of one trace without a run config."""
    frames = run_frames(trace.engine or trace.source, trace)
    m = compute_metrics(trace)
    page = Page(title)
    page.heading(title, level=1)
    page.add(table(["metric", "value"], [[k, _fmt(m.get(k))] for k in GENERIC_KEYS]))
    page.heading("Timeline", anchor="timeline")
    page.figure(overview_figure([frames]), "timeline")
    if len(frames.steps):
        page.heading("Step time over the run", anchor="steps")
        page.figure(step_time_figure([frames]), "step_time")
    path = Path(path)
    path.write_text(page.render(), encoding="utf-8")
    return path


def report_traces(paths: list[Path], out: Path) -> dict[str, dict[str, Any]]:
    """Read, measure and draw; returns the metrics by engine (or file name)."""
    traces = [read_trace(p) for p in paths]
    configs = [config_of(t) for t in traces]
    keys = [t.engine or p.stem for t, p in zip(traces, paths)]
    if len(set(keys)) < len(keys):
        keys = [p.name for p in paths]
    runs = {k: (t, compute_metrics(t)) for k, t in zip(keys, traces)}
    if configs[0] is not None:
        write_run_report(runs, configs[0], out)
    elif len(traces) == 1:
        write_trace_report(traces[0], out, f"{traces[0].source} trace {paths[0].name}")
    else:
        raise TraceError("traces without a recorded run config are drawn one at a time")
    return {k: m for k, (_, m) in runs.items()}


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


def main(argv: list[str]) -> int:
    out = Path("report.html")
    if "-o" in argv:
        i = argv.index("-o")
        if i + 1 >= len(argv):
            print("cbsim.report: -o needs a file name", file=sys.stderr)
            return 2
        out = Path(argv[i + 1])
        argv = argv[:i] + argv[i + 2 :]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[-1].strip())
        return 0 if argv else 2
    try:
        metrics = report_traces([Path(a) for a in argv], out)
    except TraceError as exc:
        print(f"cbsim.report: {exc}", file=sys.stderr)  # one line: the file and why
        return 2
    print(format_table(metrics))
    print(f"report: {out}")
    return 0
