"""A recorded run's config, as the run had it: from otherData.config, or composed again from the
overrides it recorded; and the batches the shared scheduler gave it, replayed."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cbsim.config import CbsimConfig, ConfigError
from cbsim.config.schema import HardwareConfig
from cbsim.trace import Trace


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
        merged = OmegaConf.merge(_schema(), raw)
        obj = OmegaConf.to_object(merged)
    except (OmegaConfBaseException, ConfigError) as exc:
        raise ConfigError(f"{where}: otherData.config does not fit the schema ({exc})") from None
    return obj


@functools.cache
def _schema() -> DictConfig:
    """The run config's schema as a structured config, made once (a merge copies it)."""
    return OmegaConf.structured(CbsimConfig)


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
    config: CbsimConfig, engine: str, clock: list[tuple[float, int, int]] | None = None
) -> dict[int, tuple[np.ndarray, np.ndarray]] | None:
    """Step -> (query_lens, context_lens) from the shared scheduler, driven in the engine's order
    (async: batch N+1 scheduled before N's update); an online (Poisson) workload on the
    recorded ``clock`` (``replay_on_clock``), None without one."""
    if config.workload.arrival == "offline":
        batches = replay(config, engine)
    else:
        batches = replay_on_clock(config, clock) if clock else None
    if batches is None:
        return None
    return {int(b.step): (np.array(b.query_lens), np.array(b.context_lens)) for b in batches}


# the two scheduler calls a recorded clock holds, in the order of a tie
UPDATE, SCHEDULE = 0, 1


def replay_on_clock(config: CbsimConfig, clock: list[tuple[float, int, int]]) -> list:
    """The scheduler's batches for an online workload, driven as the recording drove it:
    ``clock`` holds (seconds since the run's start, UPDATE or SCHEDULE, step) for every
    update and every schedule call that returned a batch. Which requests a batch admits
    depends on when it was asked for, so each schedule call is given the time the recording
    asked at; calls that returned nothing change nothing and are not recorded. The replay
    stops at the first step the scheduler numbers differently from the recording (the
    caller checks each batch's totals against the trace)."""
    from cbsim.scheduler import Scheduler, default_num_kv_blocks
    from cbsim.workload import make_requests

    w = config.workload
    requests = make_requests(w, config.model.vocab_size)
    sched = Scheduler(w, default_num_kv_blocks(w, requests))
    sched.add_all(requests)
    out: dict[int, object] = {}
    try:
        for now_s, what, step in sorted(clock):
            if what == SCHEDULE:
                batch = sched.schedule(now_s)
                if batch is None or int(batch.step) != step:
                    break
                out[step] = batch
            elif step in out:
                batch = out[step]
                sched.update(batch, np.ones(batch.num_samples, dtype=np.int64))
            else:
                break
    except (RuntimeError, ValueError):
        pass
    return [out[k] for k in sorted(out)]


def replay(config: CbsimConfig, engine: str) -> list | None:
    """The scheduler's batches (``cbsim.scheduler.Batch``, read-only) in step order, driven in
    the engine's order; None for online (Poisson) workloads or a workload that cannot run."""
    from cbsim.scheduler import Scheduler, default_num_kv_blocks, run_to_completion
    from cbsim.workload import make_requests

    w = config.workload
    if w.arrival != "offline":
        return None
    requests = make_requests(w, config.model.vocab_size)
    sched = Scheduler(w, default_num_kv_blocks(w, requests))
    sched.add_all(requests)
    out: list = []
    try:
        run_to_completion(
            sched,
            lambda b: np.ones(b.num_samples, dtype=np.int64),
            overlap=engine == "async",
            on_batch=lambda batch, _prev: out.append(batch),
        )
    except (RuntimeError, ValueError):
        return None
    return sorted(out, key=lambda b: int(b.step))


def hardware_from(data: dict[str, Any]) -> HardwareConfig:
    """A HardwareConfig from a profile's dict (a YAML file's content, defaults list dropped)."""
    data = {k: v for k, v in data.items() if k != "defaults"}
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(HardwareConfig), data))
    except (OmegaConfBaseException, ConfigError) as exc:
        raise ConfigError(f"hardware profile does not fit the schema ({exc})") from None
