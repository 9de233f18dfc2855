"""hydra/launcher=local and =parallel: a sweep's jobs in batches, each job composed once.

Hydra's launchers compose every job's config again where it runs (about 0.3 s a job here) and
Hydra's joblib launcher sends each job to a worker as its own task (its Hydra context, config
and singletons pickled each time). Here the job configs come composed and checked from
cbsim.preflight, and either run one after another in this process (``n_jobs: 1``, local) or go
to joblib worker processes a batch of jobs per task (parallel), while this process moves the
progress bar. Workers end when the launching process dies, however it dies (even SIGKILL), so
a killed sweep leaves no process behind.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from cbsim.interrupts import interrupts_raise
from cbsim.sweep.compose import JobComposer, composed_jobs
from cbsim.sweep.progress import update_bar

log = logging.getLogger("cbsim.sweep")
# how often a worker checks that the launching process is still there, seconds
PARENT_POLL_S = 0.5


def _end_with_parent(parent: int) -> None:
    """A worker's initializer (it runs as the worker starts, before any task): a daemon thread
    that ends the worker once the launching process is gone (the worker is then re-parented,
    so its parent id changes). An idle worker would otherwise outlive a killed sweep, holding
    its output pipes open."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(143)

    threading.Thread(target=watch, name="cbsim-parent-watch", daemon=True).start()


def run_batch(
    batch: list[tuple[int, DictConfig]],
    hydra_context: HydraContext,
    task_function: TaskFunction,
    singleton_state: dict[Any, Any] | None = None,
) -> list[tuple[int, JobReturn]]:
    """Run a batch of jobs one after another (Hydra's run_job for each)."""
    if singleton_state is not None:
        setup_globals()
        Singleton.set_state(singleton_state)
    out = []
    for idx, cfg in batch:
        ret = run_job(
            hydra_context=hydra_context,
            task_function=task_function,
            config=cfg,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
        out.append((idx, ret))
    return out


def batches(jobs: list[tuple[int, DictConfig]], count: int) -> list[list[tuple[int, DictConfig]]]:
    """``count`` batches dealt round-robin, so the long and short jobs of a grid mix in each."""
    dealt = [jobs[i::count] for i in range(max(1, min(count, len(jobs))))]
    return [b for b in dealt if b]


class BatchedLauncher(Launcher):
    """Jobs in this process (n_jobs 1) or in joblib worker processes, a batch per task."""

    def __init__(self, n_jobs: int = 1, batches_per_worker: int = 4, **joblib: Any) -> None:
        self.n_jobs = int(n_jobs)
        # batches per worker: small enough for an even finish and a moving bar, large enough
        # that a task's pickling stays a small share of it (benchmarks/bench_sweep.py)
        self.batches_per_worker = max(1, int(batches_per_worker))
        self.joblib = {k: v for k, v in joblib.items() if v is not None}
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def _job_config(self, overrides: Sequence[str], idx: int) -> DictConfig:
        assert self.config is not None
        cfg = composed_jobs.get(tuple(overrides))
        if cfg is None:  # a sweeper the preflight does not know: composed here
            cfg = JobComposer(self.config).full(overrides)
        with open_dict(cfg):
            cfg.hydra.job.id = f"{cfg.hydra.job.name}_{idx}"
            cfg.hydra.job.num = idx
        return cfg

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        jobs = [
            (initial_job_idx + i, self._job_config(ov, initial_job_idx + i))
            for i, ov in enumerate(job_overrides)
        ]
        done: dict[int, JobReturn] = {}
        with interrupts_raise():  # SIGTERM ends the sweep as Ctrl-C does: one line, 143
            self._run(jobs, done)
        return [done[idx] for idx, _ in jobs]

    def _run(self, jobs: list[tuple[int, DictConfig]], done: dict[int, JobReturn]) -> None:
        if self._workers() == 1:
            # the bar moves in the sweep callback's on_job_end, which runs in this process
            done.update(run_batch(jobs, self.hydra_context, self.task_function))
        else:
            self._in_workers(jobs, done)

    def _workers(self) -> int:
        if self.n_jobs == 1:
            return 1
        from joblib import effective_n_jobs

        return effective_n_jobs(self.n_jobs)

    def _in_workers(self, jobs: list[tuple[int, DictConfig]], done: dict[int, JobReturn]) -> None:
        from joblib import Parallel, delayed, parallel_config  # the sweep extra

        workers = self._workers()
        todo = batches(jobs, workers * self.batches_per_worker)
        log.info("%d jobs in %d batches on %d worker processes", len(jobs), len(todo), workers)
        state = Singleton.get_state()
        calls = (delayed(run_batch)(b, self.hydra_context, self.task_function, state) for b in todo)
        # loky processes (threads break Hydra), each tied to this process from its start
        backend = {"initializer": _end_with_parent, "initargs": (os.getpid(),)}
        with (
            parallel_config(backend="loky", **backend),
            Parallel(return_as="generator_unordered", n_jobs=workers, **self.joblib) as parallel,
        ):
            for results in parallel(calls):
                done.update(results)
                update_bar(len(results))
