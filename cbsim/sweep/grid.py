"""python -m cbsim.sweep.grid OUT_DIR OVERRIDE...: a what-if grid simulated in a few processes.

    python -m cbsim.sweep.grid grid_out engine=sync,async workload.batch_size=range(1,257,8) \\
        workload.gen_len=256,1024,4096 --jobs 2

The overrides are a Hydra multirun's (``a,b,c``, ``range(...)``), expanded the same way and into
the same job order; each point is simulated without a trace (cbsim.sim.iter_many) and measured
as a sweep job's metrics.json would be, and OUT_DIR gets the same summary.csv, comparison.csv
and sweep.html as ``python -m cbsim -m`` writes, with no job directories: no Hydra per job, no
files per job, so a grid of 10^4 points takes minutes. Configs are built once per choice of
config groups and then by value (cbsim.config.values), every check run as for a single run; a
bad value anywhere ends the command with one line and exit 2 before anything is written.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_module
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException
from tqdm import tqdm

from cbsim.bands import predict_bands
from cbsim.config import CbsimConfig, ConfigError
from cbsim.config.cli import Parser, positive_int
from cbsim.config.errors import describe_hydra_error
from cbsim.config.schema import RUN_EXTRA_KEYS
from cbsim.config.store import load_config, register_configs
from cbsim.config.values import replace_values
from cbsim.job_metrics import device_fit, run_metrics, wants_bands
from cbsim.metrics import MetricInputs, metrics_from
from cbsim.sim import iter_many
from cbsim.sizing import check_size
from cbsim.sweep.compose import is_value_override
from cbsim.sweep.outputs import SweepResult, write_tables
from cbsim.sweep.summary import FINISHED, Job
from cbsim.workload import check_lengths_files

# points per task sent to a worker process: the bar moves, the pickling stays small
CHUNK = 25


def expand(overrides: list[str]) -> list[list[str]]:
    """Every point's overrides, in the order a Hydra multirun numbers its jobs."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    return [list(job) for job in BasicSweeper.split_arguments(parsed, None)[0]]


class GridConfigs:
    """Config objects for grid points: composed through Hydra once per choice of groups."""

    def __init__(self) -> None:
        self.parser = OverridesParser.create()
        self._bases: dict[tuple[str, ...], CbsimConfig] = {}

    def _base(self, groups: tuple[str, ...]) -> CbsimConfig:
        if groups not in self._bases:
            with initialize_config_module(config_module="cbsim.conf", version_base="1.3"):
                config = load_config(compose("config", list(groups)))
            if config.task != "run":
                raise ConfigError(f"task={config.task} in a grid; allowed: task=run")
            for key in config.extra:
                if key not in RUN_EXTRA_KEYS:
                    raise ConfigError(
                        f"extra.{key}={config.extra[key]} is not a setting of task=run; "
                        f"allowed: {', '.join(sorted(RUN_EXTRA_KEYS))}"
                    )
            self._bases[groups] = config
        return self._bases[groups]

    def build(self, overrides: list[str]) -> CbsimConfig:
        parsed = self.parser.parse_overrides(overrides)
        groups = tuple(o.input_line for o in parsed if not is_value_override(o))
        values = {o.key_or_group: o.value() for o in parsed if is_value_override(o)}
        config = replace_values(self._base(groups), values)
        check_lengths_files(config.workload)
        check_size(config, in_sweep=True)
        return config


def measure(tables: dict[str, Any]) -> dict[str, Any]:
    """One engine's metrics as a sweep job's metrics.json holds them."""
    available = (tables.get("config") or {}).get("hardware", {}).get("memory_bytes")
    return {**metrics_from(MetricInputs(**tables)), **device_fit(tables["memory"], available)}


def point_metrics(config: CbsimConfig, per_engine: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A point's metrics.json, with its bands where mode.bands=true asks for them (a sweep's
    points have none on auto: 2 x draws simulations each)."""
    metrics = run_metrics(per_engine)
    if wants_bands(config, in_sweep=True):
        metrics["bands"] = predict_bands(config)
    # as a job's metrics.json reads back (key-sorted JSON), so both routes tabulate the same
    return json.loads(json.dumps(metrics, sort_keys=True, default=str))


def simulate_chunk(configs: list[CbsimConfig]) -> list[dict[str, Any]]:
    """metrics.json of each config (a worker process's task)."""
    dicts = [dataclasses.asdict(c) for c in configs]
    per_point = iter_many(configs, measure, config_dicts=dicts)
    return [point_metrics(c, per) for c, per in zip(configs, per_point)]


def run_grid(
    out_dir: Path,
    overrides: list[str],
    jobs: int = 1,
    html: bool = True,
    min_speedup: float = 1.05,
) -> SweepResult:
    """Build and check every point first, then simulate them and write the sweep's files."""
    points = expand(overrides)
    builder = GridConfigs()
    configs = []
    for point in points:
        try:
            configs.append(builder.build(point))
        except ConfigError as exc:
            raise ConfigError(f"{exc} (in the grid's point {' '.join(point)})") from None
    chunks = [configs[i : i + CHUNK] for i in range(0, len(configs), CHUNK)]
    metrics: list[dict[str, Any]] = []
    with tqdm(total=len(configs), unit="point", desc="grid", dynamic_ncols=True) as bar:
        for done in _results(chunks, jobs):
            metrics.extend(done)
            bar.update(len(done))
    found = [Job(i, p, None, FINISHED, m) for i, (p, m) in enumerate(zip(points, metrics))]
    out_dir.mkdir(parents=True, exist_ok=True)
    return write_tables(out_dir, found, html, min_speedup)


def _results(chunks: list[list[CbsimConfig]], jobs: int):
    """Each chunk's metrics, in order: here, or on ``jobs`` worker processes (joblib)."""
    if jobs == 1:
        for chunk in chunks:
            yield simulate_chunk(chunk)
        return
    from joblib import Parallel, delayed  # the sweep extra

    with Parallel(n_jobs=jobs, return_as="generator") as parallel:
        yield from parallel(delayed(simulate_chunk)(c) for c in chunks)


def main(argv: list[str] | None = None) -> int:
    parser = Parser("python -m cbsim.sweep.grid", __doc__)
    parser.add_argument("out_dir", type=Path, metavar="OUT_DIR", help="where the CSVs and page go")
    parser.add_argument(
        "overrides", nargs="+", metavar="OVERRIDE", help="Hydra overrides, sweeps as a,b,c"
    )
    parser.add_argument("--jobs", type=positive_int, default=1, help="worker processes (joblib)")
    parser.add_argument("--no-html", action="store_true", help="only the CSV files")
    parser.add_argument(
        "--min-speedup",
        type=float,
        default=1.05,
        help="the speedup at or above which async counts as paying (default 1.05)",
    )
    args = parser.parse(argv)
    if isinstance(args, int):
        return args
    if args.out_dir.exists() and not args.out_dir.is_dir():
        return parser.fail(f"{args.out_dir} is a file; OUT_DIR is a directory")
    register_configs()
    try:
        result = run_grid(
            args.out_dir, args.overrides, args.jobs, not args.no_html, args.min_speedup
        )
    except ConfigError as exc:
        print(f"cbsim: config error: {exc}", file=sys.stderr)
        return 2
    except (HydraException, OmegaConfBaseException) as exc:
        message = describe_hydra_error(exc)
        if message is None:
            raise
        print(f"cbsim: config error: {message}", file=sys.stderr)
        return 2
    print(
        f"cbsim: {len(result.jobs)} points: {result.summary}"
        + (f", {result.html}" if result.html else "")
    )
    print(result.verdict)
    return 0


if __name__ == "__main__":
    sys.exit(main())
