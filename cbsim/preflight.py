"""Checks before Hydra creates any directory: a run's config, or every job's of a sweep.

A Hydra callback (conf/config.yaml, hydra.callbacks.preflight, first of the callbacks): Hydra
calls ``on_run_start`` / ``on_multirun_start`` after composing the config and before it makes a
run or sweep directory, so a bad value ends the command with one line and exit 2 and leaves
nothing behind. A sweep's job configs are composed here once, checked, and kept for the
launcher (cbsim.sweep.launcher) so no job is composed twice.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from cbsim.config import ConfigError
from cbsim.config.errors import describe_hydra_error
from cbsim.config.store import load_config
from cbsim.sweep.summary import expected_overrides

# sweep job configs composed by on_multirun_start, by their overrides (this process only)
composed_jobs: dict[tuple[str, ...], DictConfig] = {}


def task_config(cfg: DictConfig) -> DictConfig:
    """The config the task sees: without the ``hydra`` node (as Hydra's run_job makes it)."""
    task = copy.deepcopy(cfg)
    with read_write(task), open_dict(task):
        task.pop("hydra", None)
    return task


def check_job(cfg: DictConfig) -> None:
    """Raise ConfigError naming the first bad value of this job's config."""
    load_config(task_config(cfg))


def _refuse(message: str) -> None:
    print(f"cbsim: config error: {message}".replace("\n", " "), file=sys.stderr)
    raise SystemExit(2)


def compose_job(master: DictConfig, overrides: list[str]) -> DictConfig:
    """A sweep job's config, as the launchers compose it."""
    loader = GlobalHydra.instance().config_loader()
    return loader.load_sweep_config(master, list(overrides))


class Preflight(Callback):
    """Refuse a bad config before anything runs or any directory exists."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            check_job(config)
        except ConfigError as exc:
            _refuse(str(exc))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        composed_jobs.clear()
        jobs = expected_overrides(config)
        if jobs is None or not GlobalHydra.instance().is_initialized():
            return  # another sweeper: each job checks its own config when it starts
        for overrides in jobs:
            try:
                job_cfg = compose_job(config, overrides)
                check_job(job_cfg)
            except ConfigError as exc:
                _refuse(f"{exc} (in the sweep's job {' '.join(overrides)})")
            except (HydraException, OmegaConfBaseException) as exc:
                message = describe_hydra_error(exc)
                if message is None:
                    raise
                _refuse(message)
            composed_jobs[tuple(overrides)] = job_cfg
