"""Checks before Hydra creates any directory: a run's config, or every job's of a sweep.

A Hydra callback (conf/config.yaml, hydra.callbacks.preflight, first of the callbacks): Hydra
calls ``on_run_start`` / ``on_multirun_start`` after composing the config and before it makes a
run or sweep directory, so a bad value ends the command with one line and exit 2 and leaves
nothing behind. A sweep's job configs are composed here once (cbsim.sweep.compose), checked, and kept
for the sweeper and the launcher (cbsim.sweep.sweeper, cbsim.sweep.launcher), so no job is
composed twice.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from cbsim.config import CbsimConfig, ConfigError
from cbsim.config.errors import describe_hydra_error
from cbsim.config.schema import RUN_EXTRA_KEYS
from cbsim.config.store import load_config
from cbsim.rundir import RunDirError, check_not_busy
from cbsim.sizing import check_size
from cbsim.sweep.compose import JobComposer, composed_jobs, task_config
from cbsim.sweep.summary import expected_overrides
from cbsim.workload import check_lengths_files

# a single run estimated to take longer than this prints its estimate before it starts
SAY_ESTIMATE_S = 60.0


def declared_extra_keys(task: str) -> dict[str, str] | None:
    """The extra keys ``task`` declares, each with what it does; None: the task checks them."""
    if task == "run":
        return RUN_EXTRA_KEYS
    if task in ("calibrate", "validate"):
        from cbsim.validation.tasks import EXTRA_KEYS  # the fitters load only for these tasks

        return EXTRA_KEYS[task]
    if task == "profile_machine":
        from cbsim.profiling.options import EXTRA_KEYS as PROFILE_KEYS

        return PROFILE_KEYS
    if task == "capacity":
        from cbsim.capacity import EXTRA_KEYS as CAPACITY_KEYS

        return CAPACITY_KEYS
    if task == "record_set":
        from cbsim.validation.record_set import EXTRA_KEYS as RECORD_SET_KEYS

        return RECORD_SET_KEYS
    if task == "datasheets":
        from cbsim.profiling.datasheet import EXTRA_KEYS as DATASHEET_KEYS

        return DATASHEET_KEYS
    return None


def check_extra(config: CbsimConfig) -> None:
    declared = declared_extra_keys(config.task)
    if declared is None:
        return
    for key in config.extra:
        if key not in declared:
            value = config.extra[key]
            raise ConfigError(
                f"extra.{key}={value} is not a setting of task={config.task}; allowed: "
                f"{', '.join(sorted(declared)) or 'none'}"
            )


def check_config(config: CbsimConfig, in_sweep: bool = False) -> CbsimConfig:
    """Beyond the values (checked as the config was built): its extra keys, the lengths files
    it names, and a run's size against this machine (cbsim.sizing)."""
    check_extra(config)
    check_lengths_files(config.workload)
    if config.task == "profile_machine":
        from cbsim.profiling.options import read_options
        from cbsim.profiling.probes import check_probes

        options = read_options(dict(config.extra))
        if options.refit is None:
            check_probes(config, dataclasses.asdict(config.model), options.probes)
    if config.task == "run":
        est = check_size(config, in_sweep)
        if not in_sweep and est.wall_s > SAY_ESTIMATE_S:  # a long run says what to expect
            print(f"cbsim: estimate: {est.describe()}", file=sys.stderr)
    return config


def check_job(cfg: DictConfig, in_sweep: bool = False) -> CbsimConfig:
    """Raise ConfigError naming the first bad value of this job's config."""
    return check_config(load_config(task_config(cfg)), in_sweep)


def run_dir_of(config: DictConfig) -> Path:
    """The directory Hydra is about to run in (hydra.run.dir, resolved as Hydra resolves it)."""
    return Path(str(config.hydra.run.dir))


def _refuse(message: str) -> None:
    print(f"cbsim: config error: {message}".replace("\n", " "), file=sys.stderr)
    raise SystemExit(2)


class Preflight(Callback):
    """Refuse a bad config before anything runs or any directory exists."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            check_job(config)
            check_not_busy(run_dir_of(config))  # before Hydra writes its .hydra/ there
        except ConfigError as exc:
            _refuse(str(exc))
        except RunDirError as exc:
            print(f"cbsim: {exc}".replace("\n", " "), file=sys.stderr)
            raise SystemExit(2) from None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        composed_jobs.clear()
        jobs = expected_overrides(config)
        if jobs is None or not GlobalHydra.instance().is_initialized():
            return  # another sweeper: each job checks its own config when it starts
        composer = JobComposer(config)
        for overrides in jobs:
            try:
                job_cfg = composer.compose(overrides)
                by_value = composer.checked(overrides)  # the same checks, without a copy
                if by_value is None:
                    check_job(job_cfg, in_sweep=True)
                else:
                    check_config(by_value, in_sweep=True)
            except ConfigError as exc:
                _refuse(f"{exc} (in the sweep's job {' '.join(overrides)})")
            except (HydraException, OmegaConfBaseException) as exc:
                message = describe_hydra_error(exc)
                if message is None:
                    raise
                _refuse(message)
            composed_jobs[tuple(overrides)] = job_cfg
