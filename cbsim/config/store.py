"""Registers the schema with Hydra's ConfigStore and turns a composed config into objects."""

from __future__ import annotations

import dataclasses

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cbsim.config.errors import ConfigError
from cbsim.config.help import help_groups
from cbsim.config.ranges import check_numbers
from cbsim.config.schema import (
    CbsimConfig,
    EngineConfig,
    HardwareConfig,
    ModeConfig,
    ModelConfig,
    WorkloadConfig,
)
from cbsim.config.shipped_profiles import register_search_path

# Each group's YAML files name "<group>_schema" first in their defaults list.
GROUP_SCHEMAS = {
    "mode": ModeConfig,
    "model": ModelConfig,
    "hardware": HardwareConfig,
    "engine": EngineConfig,
    "workload": WorkloadConfig,
}


def register_configs() -> None:
    """The schemas into Hydra's ConfigStore (once: storing them again, each a structured config
    made from its dataclass, took a fifth of a compose), the help resolver and the shipped
    profiles' search path."""
    if not OmegaConf.has_resolver("cbsim_help_groups"):
        OmegaConf.register_new_resolver("cbsim_help_groups", help_groups)
    register_search_path()
    cs = ConfigStore.instance()
    if _stored(cs):
        return
    cs.store(name="cbsim_schema", node=CbsimConfig)
    for group, node in GROUP_SCHEMAS.items():
        cs.store(group=group, name=f"{group}_schema", node=node)


def _stored(cs: ConfigStore) -> bool:
    try:
        groups = all(f"{g}_schema.yaml" in cs.list(g) for g in GROUP_SCHEMAS)
        return groups and "cbsim_schema.yaml" in cs.list("")
    except OSError:  # a group not stored yet
        return False


def load_config(cfg: DictConfig) -> CbsimConfig:
    """Validate every value (the ``__post_init__`` checks, then every number finite and in its
    range) and return typed objects."""
    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, ConfigError) else None
        if cause is not None:
            raise cause from None
        raise ConfigError(str(exc)) from None
    if not isinstance(obj, CbsimConfig):
        raise ConfigError("the composed config is not a cbsim config (is cbsim_schema first?)")
    _reject_unknown_keys(obj, "")
    check_numbers(obj)
    return obj


def _reject_unknown_keys(node: object, prefix: str) -> None:
    """Hydra's ``+key=value`` can add keys to a structured config; cbsim has no free-form nodes
    except ``extra``, so an added key is a typo and fails here."""
    known = {f.name for f in dataclasses.fields(node)}
    for key, value in vars(node).items():
        if key not in known:
            raise ConfigError(
                f"{prefix}{key}={value} is not a key here; allowed: {', '.join(sorted(known))}"
            )
        if dataclasses.is_dataclass(value):
            _reject_unknown_keys(value, f"{prefix}{key}.")
