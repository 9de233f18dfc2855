"""A report for trace files alone: any producer of the format (sim, runtime, an imported Kineto
trace) is drawn by the same code, any number of traces side by side. With the run config in
otherData it is the full run report; without one the metrics keep their names and units and what
the traces recorded (device, versions, overrides) stands in for the config.

    python -m cbsim.report TRACE [TRACE ...] [-o report.html] [--shared-js]
    python -m cbsim.report outputs/DATE/TIME/trace_async.json.gz -o async.html
    python -m cbsim.trace.kineto profile.json k.json.gz && python -m cbsim.report k.json.gz

--shared-js: several reports in one directory share one plotly.min.js.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cbsim.config import CbsimConfig, ConfigError
from cbsim.config.cli import Once, Parser, existing_file, writable_file
from cbsim.config.store import load_config
from cbsim.metrics import compute_metrics, format_table
from cbsim.report.run_report import write_run_report
from cbsim.trace import Trace, TraceError, read_traces


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


def run_keys(traces: list[Trace], paths: list[Path]) -> list[str]:
    """A name per trace: its engine, else its file name; file names (then paths) when those
    repeat (two sync traces of two recordings)."""
    for keys in (
        [t.engine or p.name for t, p in zip(traces, paths)],
        [p.name for p in paths],
        [str(p) for p in paths],
    ):
        if len(set(keys)) == len(keys):
            return keys
    return [f"{i}: {p}" for i, p in enumerate(paths)]


def report_traces(
    paths: list[Path], out: Path, shared_js: bool = False
) -> dict[str, dict[str, Any]]:
    """Read, measure and draw; returns the metrics by engine (or file name). A merged trace
    (sync and async in one file) gives its runs."""
    runs_of = [(t, p) for p in paths for t in read_traces(p).values()]
    traces, paths = [t for t, _ in runs_of], [p for _, p in runs_of]
    configs = [config_of(t) for t in traces]
    keys = run_keys(traces, paths)
    runs = {k: (t, compute_metrics(t)) for k, t in zip(keys, traces)}
    # one config for the page only when every trace was run with the same workload and model
    same = all(c is not None for c in configs) and all(
        (c.workload, c.model, c.hardware)
        == (configs[0].workload, configs[0].model, configs[0].hardware)
        for c in configs
    )
    js_dir = out.parent if shared_js else None
    config = configs[0] if same else None
    write_run_report(runs, config, out, js_dir=js_dir, files=[str(p) for p in paths])
    return {k: m for k, (_, m) in runs.items()}


def parser() -> Parser:
    p = Parser("python -m cbsim.report", __doc__)
    p.add_argument("traces", nargs="+", type=existing_file, metavar="TRACE", help="trace files")
    p.add_argument(
        "-o",
        "--output",
        type=writable_file,
        default=Path("report.html"),
        action=Once,
        metavar="FILE",
        help="the report to write (default report.html)",
    )
    p.add_argument(
        "--shared-js",
        action="store_true",
        help="reference a plotly.min.js beside the report instead of inlining it",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse(argv)
    if isinstance(args, int):
        return args
    out = args.output
    try:
        metrics = report_traces(args.traces, out, args.shared_js)
    except TraceError as exc:
        print(f"cbsim.report: {exc}", file=sys.stderr)  # one line: the file and why
        return 2
    except OSError as exc:
        print(f"cbsim.report: {out}: cannot write the report ({exc.strerror})", file=sys.stderr)
        return 2
    print(format_table(metrics))
    print(f"report: {out}")
    return 0
