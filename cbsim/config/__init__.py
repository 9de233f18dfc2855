"""The declarative config tree: schema, validation and Hydra registration."""

from cbsim.config.errors import ConfigError
from cbsim.config.schema import (
    CbsimConfig,
    EngineConfig,
    HardwareConfig,
    ModeConfig,
    ModelConfig,
    WorkloadConfig,
)

__all__ = [
    "CbsimConfig",
    "ConfigError",
    "EngineConfig",
    "HardwareConfig",
    "ModeConfig",
    "ModelConfig",
    "WorkloadConfig",
]
