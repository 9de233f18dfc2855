"""Config errors that name the key and what is allowed, all in one form:
``<key>=<value> <what is wrong>; allowed: <what is>``."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable

from hydra.errors import InstantiationException, MissingConfigException, OverrideParseException
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    OmegaConfBaseException,
    ValidationError,
)


class ConfigError(ValueError):
    """A config value that cannot run; the message names the key and the allowed values."""


def check_choice(key: str, value: object, allowed: Iterable[object]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ConfigError(
            f"{key}={value} is not an option; allowed: {', '.join(map(str, allowed))}"
        )


def check_positive(key: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{key}={value} is out of range; allowed: > 0")


def check_range(key: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ConfigError(f"{key}={value} is out of range; allowed: {low} to {high}")


def describe_hydra_error(exc: BaseException) -> str | None:
    """Hydra's and OmegaConf's composition errors (a wrong type, an unknown key or option, a
    bad override) as one line naming the key; None for anything that is not about the config."""
    if isinstance(exc, InstantiationException):  # a launcher or callback that failed to start
        return None
    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file:
        group, _, option = str(exc.missing_cfg_file).rpartition("/")
        options = [o for o in exc.options or [] if not o.endswith("_schema")]
        if group and options:
            return f"{group}={option} is not an option; allowed: {', '.join(options)}"
    if isinstance(exc, OverrideParseException):
        first = str(exc.message).splitlines()[0]
        return f"{exc.override} cannot be read ({first}); allowed: key=value, see --help"
    cause = exc.__cause__ if isinstance(exc.__cause__, OmegaConfBaseException) else exc
    if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
        described = _describe_key_error(cause, str(exc))
        if described:
            return described
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return "; ".join(dict.fromkeys(lines)) or None


def _describe_key_error(cause: OmegaConfBaseException, outer: str) -> str | None:
    """An unknown key (the keys allowed there listed) or a value of the wrong type."""
    key, schema = str(cause.full_key), getattr(cause, "object_type", None)
    known = dataclasses.is_dataclass(schema)
    leaf = key.rsplit(".", 1)[-1]
    first = str(cause).splitlines()[0].strip()
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
        if known:
            names = [f.name for f in dataclasses.fields(schema)]
        else:  # a free-form dict (extra): the keys it holds are the ones the task declared
            node = getattr(cause, "parent_node", None)
            names = [str(k) for k in node.keys()] if hasattr(node, "keys") else []
        allowed = ", ".join(sorted(names)) or "none (nothing is declared here)"
        return f"{key} is not a key here; allowed: {allowed}"
    if isinstance(cause, ValidationError):
        given = outer.split("override ", 1)[-1].strip() if "override " in outer else key
        wanted = typing.get_type_hints(schema).get(leaf) if known else None
        name = getattr(wanted, "__name__", None) or str(wanted or "the key's type")
        return f"{given} has the wrong type ({first}); allowed: a value of type {name}"
    return None
