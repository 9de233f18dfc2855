"""A sweep's job configs, each composed as Hydra composes it, with the shared work done once.

Composing one job's config through Hydra's defaults list costs about 0.3 s on this machine, and
a 200-job grid of plain values (workload.batch_size=1,...,256) composes the same defaults 200
times over. Here the defaults are composed once per distinct choice of config groups (engine=
sync, engine=async) and each job's value overrides are then applied by Hydra's own override
code, in the same order as Hydra applies them after composing; its bookkeeping (the task
overrides, the override dirname) is set the way Hydra sets it. An override that could change
the defaults list itself (a group, +key, ~key, a hydra key, a top-level key) takes Hydra's full
path, as does every job in a sweep whose configs this cannot reproduce.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from hydra._internal.config_loader_impl import get_overrides_dirname
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from omegaconf import DictConfig, open_dict, read_write

from cbsim.config.schema import CbsimConfig
from cbsim.config.store import load_config
from cbsim.config.values import replace_values

# a sweep's job configs as cbsim.preflight composed and checked them, by their overrides (the
# launching process only); the sweeper and the launcher take them from here
composed_jobs: dict[tuple[str, ...], DictConfig] = {}


def is_value_override(o: Override) -> bool:
    """key.sub=value on an existing key: it changes a value, never which files compose."""
    key = o.key_or_group
    return (
        o.type == OverrideType.CHANGE
        and o.package is None
        and not o.is_sweep_override()
        and "." in key
        and "/" not in key
        and not key.startswith("hydra.")
    )


def task_config(cfg: DictConfig) -> DictConfig:
    """The config the task sees: without the ``hydra`` node (as Hydra's run_job makes it)."""
    task = copy.deepcopy(cfg)
    with read_write(task), open_dict(task):
        task.pop("hydra", None)
    return task


class JobComposer:
    """Composes job configs of one sweep, caching the defaults by group choices."""

    def __init__(self, master: DictConfig) -> None:
        self.master = master
        self.loader = GlobalHydra.instance().config_loader()
        self.parser = OverridesParser.create(config_loader=self.loader)
        self._bases: dict[tuple[str, ...], DictConfig] = {}
        self._objects: dict[tuple[str, ...], CbsimConfig] = {}

    def full(self, overrides: Sequence[str]) -> DictConfig:
        """Hydra's own composition of one job."""
        return self.loader.load_sweep_config(self.master, list(overrides))

    def checked(self, overrides: Sequence[str]) -> CbsimConfig | None:
        """The job's config object, built from its groups' checked defaults by value (every
        check of a single run runs again, cbsim.config.values); None when the job takes
        Hydra's full path (then check the composed config itself)."""
        parsed = self.parser.parse_overrides(list(overrides))
        values = {o.key_or_group: o.value() for o in parsed if is_value_override(o)}
        groups = tuple(o.input_line for o in parsed if not is_value_override(o))
        if not values or groups not in self._bases:
            return None
        if groups not in self._objects:
            self._objects[groups] = load_config(task_config(self._bases[groups]))
        return replace_values(self._objects[groups], values)

    def compose(self, overrides: Sequence[str]) -> DictConfig:
        parsed = self.parser.parse_overrides(list(overrides))
        values = [o for o in parsed if is_value_override(o)]
        if not values:
            return self.full(overrides)
        groups = tuple(o.input_line for o in parsed if not is_value_override(o))
        if groups not in self._bases:
            self._bases[groups] = self.full(list(groups))
        cfg = copy.deepcopy(self._bases[groups])
        with read_write(cfg):
            self.loader._apply_overrides_to_config(values, cfg)  # Hydra's own value overrides
            self._bookkeeping(cfg, parsed)
        return cfg

    def _bookkeeping(self, cfg: DictConfig, parsed: list[Override]) -> None:
        """hydra.overrides.task and hydra.job.override_dirname, as Hydra writes them."""
        task = [o for o in parsed if not o.is_hydra_override()]
        dirname = cfg.hydra.job.config.override_dirname
        with open_dict(cfg.hydra):
            cfg.hydra.overrides.task = [o.input_line for o in task]
            cfg.hydra.job.override_dirname = get_overrides_dirname(
                overrides=task,
                kv_sep=dirname.kv_sep,
                item_sep=dirname.item_sep,
                exclude_keys=dirname.exclude_keys,
            )
