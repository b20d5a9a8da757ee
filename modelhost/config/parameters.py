"""A model config's `parameters` (string values, as config.pbtxt holds them) read as numbers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.config.pbtxt import ConfigError

T = TypeVar("T")


def string_parameters(config: ModelConfig, lower: bool = False) -> dict[str, str]:
    """The config's parameters by name (lower-cased with `lower`, for backends whose names ignore case)."""
    return {(key.lower() if lower else key): value.string_value for key, value in config.parameters.items()}


def natural_parameter(parameters: Mapping[str, str], names: Sequence[str], default: T) -> int | T:
    """The first of `names` (spellings of one setting) that `parameters` has, as an integer >= 0; `default` when
    none is there. Raises ConfigError naming the parameter and its value."""
    for name in names:
        if name in parameters:
            text = parameters[name]
            try:
                value = int(text)
            except ValueError:
                value = -1
            if value < 0:
                raise ConfigError(f"parameter {name} must be an integer >= 0, got '{text}'")
            return value
    return default
