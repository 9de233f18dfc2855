"""Config errors that name the key and what is allowed."""

from __future__ import annotations

from collections.abc import Iterable


class ConfigError(ValueError):
    """A config value that cannot run; the message names the key and the allowed values."""


def check_choice(key: str, value: object, allowed: Iterable[object]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ConfigError(
            f"{key}={value!r} is not allowed; allowed values: {', '.join(map(str, allowed))}"
        )


def check_positive(key: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{key}={value} must be > 0")


def check_range(key: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ConfigError(f"{key}={value} is out of range; allowed: {low} to {high}")
