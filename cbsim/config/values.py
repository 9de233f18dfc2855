"""Dotted values set on a built config (``workload.batch_size=8``) without composing it again.

For a grid of thousands of points that differ only in values: each changed node is rebuilt
with ``dataclasses.replace``, so its ``__post_init__`` checks run as they do when Hydra builds
it, the value is coerced as OmegaConf would (an int for a float field, nothing else across
types), and every number is then checked for its range (cbsim.config.ranges).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from cbsim.config.errors import ConfigError
from cbsim.config.ranges import check_numbers
from cbsim.config.schema import CbsimConfig


def nest_keys(values: dict[str, Any]) -> dict[str, Any]:
    """{"workload.batch_size": 8} -> {"workload": {"batch_size": 8}}."""
    tree: dict[str, Any] = {}
    for key, value in values.items():
        *path, leaf = str(key).split(".")
        node = tree
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def coerce(key: str, value: Any, kind: Any) -> Any:
    """``value`` as field type ``kind`` takes it, or a ConfigError naming what is allowed."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        kind = next(a for a in args if a is not type(None))
        args = typing.get_args(kind)
    if typing.get_origin(kind) is list and isinstance(value, list):
        return [coerce(key, v, args[0] if args else Any) for v in value]
    if kind is Any or (isinstance(kind, type) and type(value) is kind):
        return value
    converted = _primitive(value, kind)
    if converted is not None:
        return converted
    name = getattr(kind, "__name__", str(kind))
    raise ConfigError(f"{key}={value} has the wrong type; allowed: a value of type {name}")


_TRUE, _FALSE = ("true", "yes", "on", "y"), ("false", "no", "off", "n")


def _primitive(value: Any, kind: Any) -> Any:
    """OmegaConf's conversions between primitives (None where it refuses): an int or a number
    text for a float; a whole-number text for an int; an int (non-zero: true) or a yes/no word
    for a bool; any primitive's text for a str."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    text = value.strip().lower() if isinstance(value, str) else None
    try:
        if kind is float and (number or text is not None):
            return float(value)
        if kind is int and text is not None:
            return int(text)
    except ValueError:
        return None
    if kind is bool and isinstance(value, int) and not isinstance(value, bool):
        return value != 0
    if kind is bool and text in _TRUE + _FALSE:
        return text in _TRUE
    if kind is str and isinstance(value, (int, float, bool)):
        return str(value)
    return None


def _rebuild(node: Any, changes: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(type(node))
    names = {f.name for f in dataclasses.fields(node)}
    kwargs = {}
    for name, change in changes.items():
        key = f"{prefix}{name}"
        if name not in names:
            raise ConfigError(f"{key} is not a key here; allowed: {', '.join(sorted(names))}")
        current = getattr(node, name)
        if dataclasses.is_dataclass(current) and isinstance(change, dict):
            kwargs[name] = _rebuild(current, change, f"{key}.")
        elif isinstance(current, dict) and isinstance(change, dict):
            kwargs[name] = _merge(current, change, f"{key}.")
        else:
            kwargs[name] = coerce(key, change, hints[name])
    return dataclasses.replace(node, **kwargs)


def _merge(current: dict[str, Any], change: dict[str, Any], prefix: str) -> dict[str, Any]:
    """A free-form dict (``extra``) with existing keys changed; a new key needs Hydra's
    ``+key=value``, as it does on the command line."""
    out = dict(current)
    for name, value in change.items():
        if name not in current:
            allowed = ", ".join(sorted(current)) or "none (add one with +key=value)"
            raise ConfigError(f"{prefix}{name} is not a key here; allowed: {allowed}")
        nested = isinstance(current[name], dict) and isinstance(value, dict)
        out[name] = _merge(current[name], value, f"{prefix}{name}.") if nested else value
    return out


def replace_values(config: CbsimConfig, values: dict[str, Any]) -> CbsimConfig:
    """``config`` with each dotted key set to its value, every check run again."""
    if not values:
        return config
    out = _rebuild(config, nest_keys(values), "")
    check_numbers(out)
    return out
