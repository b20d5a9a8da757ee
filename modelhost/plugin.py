"""modelhost's public plug-in API: the names code outside modelhost may import and rely on.

- A backend for another model format: subclass `Backend` (and `Model`), register the class under the entry-point
  group `modelhost.backends` of your distribution, and choose it with `backend: "<name>"` in a config.pbtxt
  (docs/plugins.md).
- A Python model's `model.py` (docs/backends/python.md) and a SageMaker model's `code/inference.py`
  (docs/sagemaker.md) need nothing from modelhost; they may raise `ModelhostError` (`invalid(...)` for the
  caller's fault) to answer with its status.

Every other module of the package is internal: its names may change in any release.
"""

from __future__ import annotations

from modelhost.backends.base import Backend, InstanceSettings, Model, ModelSignature, config_signature
from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.config.pbtxt import ConfigError
from modelhost.errors import ErrorKind, ModelhostError, invalid, not_found, unavailable
from modelhost.types import DATATYPE_DTYPES, TensorSpec

__all__ = [
    "DATATYPE_DTYPES",
    "Backend",
    "ConfigError",
    "ErrorKind",
    "InstanceSettings",
    "Model",
    "ModelConfig",
    "ModelSignature",
    "ModelhostError",
    "TensorSpec",
    "config_signature",
    "invalid",
    "not_found",
    "unavailable",
]
